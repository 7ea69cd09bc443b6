"""A plain onnxruntime generation loop over an OGA-style decoder graph.

The onnxruntime-genai model builder writes a decoder whose inputs are `input_ids`, `attention_mask`,
optionally `position_ids`, and one `past_key_values.N.key/value` pair per layer, and whose outputs are
`logits` and `present.N.key/value`. `OrtDecoder` drives such a graph with nothing but
`onnxruntime.InferenceSession`: the first call gets an empty past of length 0, each later call gets the
previous `present` tensors as its past. It reproduces onnxruntime-genai's greedy tokens exactly on CPU
and is what the fusion reference runtime and the smoke stage build on.

Names, layer count, KV head count and head size all come from `genai_config.json`; nothing is guessed
from the graph except the dtypes and which optional inputs it has.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import numpy as np

_ORT_TO_NUMPY = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}


class OrtDecoder:
    """Runs the decoder graph of an exported folder (one with `genai_config.json`) on onnxruntime.

    `threads` sets intra-op threads (None lets onnxruntime choose). `providers` defaults to CPU only.
    `filename` overrides `model.decoder.filename` from the config.
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        threads: int | None = None,
        providers: Sequence[str] | None = None,
        filename: str | None = None,
        session_options=None,
        logits_rows: bool = False,
    ):
        import onnxruntime as ort

        self.folder = Path(folder)
        with open(self.folder / "genai_config.json", encoding="utf-8") as fh:
            self.genai = json.load(fh)
        model = self.genai["model"]
        dec = model["decoder"]
        self.num_layers = int(dec["num_hidden_layers"])
        self.num_kv_heads = int(dec["num_key_value_heads"])
        self.head_size = int(dec["head_size"])
        ins, outs = dec.get("inputs", {}), dec.get("outputs", {})
        self.input_ids_name = ins.get("input_ids", "input_ids")
        self.attention_mask_name = ins.get("attention_mask", "attention_mask")
        self.position_ids_name = ins.get("position_ids", "position_ids")
        past_k = ins.get("past_key_names", "past_key_values.%d.key")
        past_v = ins.get("past_value_names", "past_key_values.%d.value")
        pres_k = outs.get("present_key_names", "present.%d.key")
        pres_v = outs.get("present_value_names", "present.%d.value")
        self.logits_name = outs.get("logits", "logits")
        self.past_names = [(past_k % i, past_v % i) for i in range(self.num_layers)]
        self.present_names = [(pres_k % i, pres_v % i) for i in range(self.num_layers)]
        eos = model.get("eos_token_id", [])
        self.eos_token_ids = {int(e) for e in (eos if isinstance(eos, list) else [eos])}
        self.context_length = int(model.get("context_length", 0)) or None

        so = session_options or ort.SessionOptions()
        if threads is not None:
            so.intra_op_num_threads = int(threads)
            so.inter_op_num_threads = 1
        path = self.folder / (filename or dec.get("filename", "model.onnx"))
        # logits_rows: the graph gets an input saying which positions' logits to compute (rows_graph)
        self.logits_rows = logits_rows
        if logits_rows:
            so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(path.parent))
        self.session = ort.InferenceSession(
            rows_graph(path, self.logits_name) if logits_rows else str(path), so, providers=list(providers or ["CPUExecutionProvider"])
        )
        graph_inputs = {i.name: i for i in self.session.get_inputs()}
        self.has_attention_mask = self.attention_mask_name in graph_inputs
        self.has_position_ids = self.position_ids_name in graph_inputs
        self._dtype = {
            name: _ORT_TO_NUMPY.get(arg.type, np.float32) for name, arg in graph_inputs.items()
        }
        missing = [n for pair in self.past_names for n in pair if n not in graph_inputs]
        if self.input_ids_name not in graph_inputs or missing:
            raise ValueError(
                f"{path.name}: graph inputs {sorted(graph_inputs)} do not match genai_config.json "
                f"(expected {self.input_ids_name!r} and {len(self.past_names) * 2} past inputs)"
            )
        self.output_names = [self.logits_name] + [n for pair in self.present_names for n in pair]

    # -- one forward call -------------------------------------------------------------------------

    def empty_past(self, batch: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
        shape = (batch, self.num_kv_heads, 0, self.head_size)
        return [
            (np.zeros(shape, self._dtype[k]), np.zeros(shape, self._dtype[v]))
            for k, v in self.past_names
        ]

    def forward(self, ids: np.ndarray, past: list[tuple[np.ndarray, np.ndarray]], rows: Sequence[int] | None = None):
        """One call: `ids` [1, s] after `past` (length p). Returns (logits [1, s', V], present). On a decoder made
        with `logits_rows`, `rows` (positions in this call) are the logits computed, in that order (default all)."""
        ids = np.asarray(ids).reshape(1, -1)
        past_len = past[0][0].shape[2]
        total = past_len + ids.shape[1]
        feed = {self.input_ids_name: ids.astype(self._dtype[self.input_ids_name])}
        if self.has_attention_mask:
            feed[self.attention_mask_name] = np.ones((1, total), self._dtype[self.attention_mask_name])
        if self.has_position_ids:
            feed[self.position_ids_name] = np.arange(past_len, total, dtype=self._dtype[self.position_ids_name]).reshape(1, -1)
        for (kn, vn), (k, v) in zip(self.past_names, past):
            feed[kn], feed[vn] = k, v
        if self.logits_rows:
            feed[ROWS_INPUT] = np.asarray(range(ids.shape[1]) if rows is None else rows, np.int64).reshape(-1)
        out = self.session.run(self.output_names, feed)
        present = [(out[1 + 2 * i], out[2 + 2 * i]) for i in range(self.num_layers)]
        return out[0], present

    def prefill(self, input_ids: Sequence[int], chunk_size: int | None = None, *, last_only: bool = False):
        """Runs the prompt, in chunks of `chunk_size` if given. Returns (logits [s, V] float32, present).

        If the graph prunes its lm_head to the last position, the rows it does not return are NaN.
        With `last_only` only the last position's row is kept ([1, V]): a 5000-token prompt's rows
        are 2.6 GB at a 128K vocabulary, and greedy decoding reads one; a decoder made with `logits_rows`
        does not compute the others.
        """
        ids = np.asarray(input_ids, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise ValueError("prompt is empty: give at least one token id")
        step = int(chunk_size) if chunk_size else ids.size
        past = self.empty_past()
        rows = []
        for start in range(0, ids.size, step):
            chunk = ids[start : start + step]
            if last_only and self.logits_rows:  # each call computes its last row only (the lm_head of one position)
                logits, past = self.forward(chunk[None, :], past, [chunk.size - 1])
            else:
                logits, past = self.forward(chunk[None, :], past)
            if last_only:
                rows = [np.array(logits[0, -1:], dtype=np.float32)]  # a copy: the call's output is freed
                continue
            logits = np.asarray(logits, dtype=np.float32)[0]
            if logits.shape[0] != chunk.size:  # pruned lm_head: only the last row comes back
                full = np.full((chunk.size, logits.shape[-1]), np.nan, np.float32)
                full[-logits.shape[0] :] = logits
                logits = full
            rows.append(logits)
        return np.concatenate(rows, axis=0), past

    def forced(self, prompt: Sequence[int], branches: dict[int, Sequence[int]], chunk_size: int | None = None) -> dict[int, list[int]]:
        """This graph's own greedy choices along given continuations of prefixes of one prompt, from one
        prefill of the prompt's longest prefix asked for (in calls of `chunk_size` positions).

        `branches` maps a prefix length L to tokens T. For each, the answer is the argmax after
        prompt[:L] and after each of T but the last: len(T) token ids. They equal `greedy(prompt[:L],
        len(T))[0]` exactly when T is what this graph's greedy decoding gives, and the first one that
        differs from T is the first token greedy decoding would change. The row choosing T[0] is row L-1
        of the one prefill (a causal decoder's logits there see prompt[:L] only); the rest come from one
        call over T[:-1] after the prefill's keys and values cut at L. Only the argmax of the rows
        asked for is kept. A graph whose lm_head returns the last row only is decoded with `greedy`."""
        if not branches or min(branches) < 1 or max(branches) > len(prompt) or not all(len(t) for t in branches.values()):
            raise ValueError(f"forced() needs prefix lengths from 1 to the prompt's {len(prompt)} tokens, each with at least one token after it")
        ids = np.asarray(prompt, dtype=np.int64).reshape(-1)[: max(branches)]
        rows = {length - 1 for length in branches}
        step = int(chunk_size) if chunk_size else ids.size
        past, chosen = self.empty_past(), {}
        for start in range(0, ids.size, step):
            chunk = ids[start : start + step]
            wanted = sorted(r for r in rows if start <= r < start + chunk.size)
            if self.logits_rows:  # only the rows asked for are computed (at least one: the lm_head's shape stays a matrix)
                logits, past = self.forward(chunk[None, :], past, [r - start for r in wanted] or [chunk.size - 1])
                chosen.update({r: int(np.argmax(logits[0, i])) for i, r in enumerate(wanted)})
                continue
            logits, past = self.forward(chunk[None, :], past)
            if logits.shape[1] != chunk.size:  # pruned lm_head: the rows are not there to compare
                return {n: self.greedy(ids[:n], len(t), chunk_size=chunk_size)[0] for n, t in branches.items()}
            chosen.update({r: int(np.argmax(logits[0, r - start])) for r in wanted})
            del logits  # the chunk's rows, before the next call allocates its own
        out = {}
        for n, tokens in branches.items():
            out[n] = [chosen[n - 1]]
            if len(tokens) > 1:
                cut = [(np.ascontiguousarray(k[:, :, :n]), np.ascontiguousarray(v[:, :, :n])) for k, v in past]
                logits, _ = self.forward(np.asarray(tokens[:-1], np.int64)[None, :], cut)
                if logits.shape[1] != len(tokens) - 1:  # pruned lm_head
                    out[n] = self.greedy(ids[:n], len(tokens), chunk_size=chunk_size)[0]
                    continue
                out[n] += [int(t) for t in np.argmax(logits[0], axis=-1)]
        return out

    # -- public helpers ---------------------------------------------------------------------------

    def logits(self, input_ids: Sequence[int], chunk_size: int | None = None) -> np.ndarray:
        """Logits [len(input_ids), vocab] (float32) for a prompt, position by position."""
        return self.prefill(input_ids, chunk_size)[0]

    def greedy(
        self,
        input_ids: Sequence[int],
        max_new_tokens: int,
        *,
        chunk_size: int | None = None,
        stop_at_eos: bool = False,
    ) -> tuple[list[int], list[np.ndarray]]:
        """Greedy decoding. Returns (new tokens, the logits row [vocab] each token was chosen from).

        With `stop_at_eos` the loop ends after emitting an EOS id from genai_config.json, as
        onnxruntime-genai does; without it, exactly `max_new_tokens` tokens come back.
        """
        logits, past = self.prefill(input_ids, chunk_size, last_only=True)
        row = logits[-1]
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        for step in range(int(max_new_tokens)):
            tok = int(np.argmax(row))
            tokens.append(tok)
            rows.append(row)
            if (stop_at_eos and tok in self.eos_token_ids) or step == max_new_tokens - 1:
                break
            out, past = self.forward(np.array([[tok]], np.int64), past)
            row = np.asarray(out, dtype=np.float32)[0, -1]
        return tokens, rows


ROWS_INPUT = "raipack_logits_rows"


def rows_graph(path: Path, logits_name: str) -> bytes:
    """The decoder graph at `path` (its external data stays where it is) with one more input, ROWS_INPUT (int64,
    [rows]): the lm_head reads the hidden states of those positions only, so a long prefill whose rows are not
    compared does not compute them (at Llama-3.1-8B the lm_head is 7 % of a prefill; 128K logits per position).
    The lm_head is the MatMul (or MatMulNBits/Gemm) the logits output is computed from, through elementwise nodes."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    node = producer.get(logits_name)
    while node is not None and node.op_type not in ("MatMul", "MatMulNBits", "Gemm"):
        node = producer.get(node.input[0]) if node.op_type in ("Cast", "Add", "Mul", "Identity") else None
    if node is None:
        raise ValueError(f"{path.name}: no lm_head MatMul computes {logits_name!r}")
    gathered = f"{node.input[0]}/{ROWS_INPUT}"
    gather = helper.make_node("Gather", [node.input[0], ROWS_INPUT], [gathered], name=f"/{ROWS_INPUT}/Gather", axis=1)
    graph.node.insert(list(graph.node).index(node), gather)
    node.input[0] = gathered
    graph.input.append(helper.make_tensor_value_info(ROWS_INPUT, TensorProto.INT64, ["rows"]))
    for out in graph.output:
        if out.name == logits_name and len(out.type.tensor_type.shape.dim) == 3:
            out.type.tensor_type.shape.dim[1].dim_param = "rows"
    return model.SerializeToString()


def perplexity(logits: np.ndarray, input_ids: Sequence[int], block: int = 64) -> float:
    """exp(mean negative log-likelihood) of ids[1:] under logits[:-1] (natural log, float64), `block`
    rows at a time: a float64 copy of all rows would be 1 GiB for 512 rows at a 128K vocabulary."""
    ids = np.asarray(input_ids, dtype=np.int64).reshape(-1)
    if ids.size < 2:
        raise ValueError("perplexity needs at least two tokens")
    nll = 0.0
    for start in range(0, ids.size - 1, block):
        end = min(start + block, ids.size - 1)
        x = np.asarray(logits[start:end], dtype=np.float64)
        m = x.max(axis=-1, keepdims=True)
        logz = (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))[:, 0]
        nll += float((logz - x[np.arange(end - start), ids[start + 1 : end + 1]]).sum())
    return float(math.exp(nll / (ids.size - 1)))
