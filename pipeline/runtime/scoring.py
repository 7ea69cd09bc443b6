"""The reference runtime with every row's logits from a prefill call, for held-out perplexity.

A reference package's graph runs its lm_head on the last real row of each call only (stages/fuse/graph/cpu_side.py:
the `/raipack/logits/LastRow` Gather), as the NPU runtime reads it; scoring a window that way takes one token
step per token (at Llama-3.1-8B 68 steps were 20 s of the smoke stage, the float and BFP16 windows 256 steps each
at Llama-3.2-1B). `ScoringRuntime` loads the same package with that one edit undone in memory: the lm_head reads
every row of the hidden state, so a window is scored from its prefill calls (rows of the padding are dropped).
The package's files are untouched and checked as `ReferenceRuntime` checks them; the weights, plans, KV cache and
numerics (BFP16 too) are the same code. A prefill computes the lm_head on every position of its tier, so this
runtime is for scoring short windows (the check budget's ≤ 256 tokens), not for answering long prompts; the
smoke stage's package runs keep the last-row graph.

Rows from a prefill and from token steps are the same arithmetic up to float summation order; under BFP16 the
keys and values of a prefill's own positions are rounded to bfloat16 after the call, as the device's prefill
would hold them, where token steps round each before the next token reads it
(tests/test_pipeline/test_scoring.py compares the two)."""

from __future__ import annotations

from typing import Sequence

from raipack.runtime.reference import ReferenceRuntime

LAST_ROW = "/raipack/logits/LastRow"  # the Gather that stages/fuse/graph/cpu_side.py puts before the lm_head


def all_rows_graph(model) -> bool:
    """Rewires, in place, every reader of the last-row Gather's output to its input (the whole hidden state) and
    frees the logits output's sequence dimension; False (the model unchanged) when the graph has no such Gather."""
    gather = next((n for n in model.graph.node if n.name == LAST_ROW and n.op_type == "Gather"), None)
    if gather is None:
        return False
    last, hidden = gather.output[0], gather.input[0]
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name == last:
                node.input[i] = hidden
    for out in model.graph.output:
        dims = out.type.tensor_type.shape.dim
        if len(dims) == 3:
            dims[1].Clear()
            dims[1].dim_param = "sequence_length"
    return True


class ScoringRuntime(ReferenceRuntime):
    """A ReferenceRuntime whose prefill calls give every row's logits (`rows`); token steps give one row as before.
    `all_rows` is False for a graph without the last-row Gather (a hybrid or older package): it is then scored with
    token steps, as by a ReferenceRuntime."""

    def _start_session(self, graph_path, model, names: list, values: list, threads: int | None) -> None:
        self.all_rows = all_rows_graph(model)
        self.graph_edited = self.all_rows
        self._rows: list = []
        super()._start_session(graph_path, model, names, values, threads)

    def _call(self, phase: str, tokens, seq: int):
        import numpy as np

        if not self.all_rows:
            return super()._call(phase, tokens, seq)
        shape = (1, seq if phase == "prefill" else 1, self.vocab_size)
        if self._logits.shape != shape:  # the output bound to a buffer of this call's rows
            self._logits = np.zeros(shape, np.float32)
            self._binding.bind_output(self.logits_name, "cpu", 0, np.float32, list(shape), self._logits.ctypes.data)
        super()._call(phase, tokens, seq)
        n = len(tokens)
        if phase == "prefill":
            self._rows.append(self._logits[0, :n].copy())
        return self._logits[0, n - 1]

    def rows(self, ids: Sequence[int]):
        """The logits of every position of `ids` ([len(ids), vocab], float32) from its prefill: row i scores ids[i + 1].
        Only when `all_rows` (raipack.runtime.heldout.package_perplexity steps otherwise)."""
        import numpy as np

        if not self.all_rows:
            raise ValueError("this package's graph has no last-row Gather to undo; score it with token steps")
        self._rows = []
        self.prefill(ids)
        out, self._rows = (self._rows[0] if len(self._rows) == 1 else np.concatenate(self._rows)), []  # one chunk: no second copy
        return out
