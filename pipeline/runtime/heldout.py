"""A package's perplexity on raipack's held-out text, the way the NPU runtime would run it.

The fused graph returns the last position's logits only, so on a ReferenceRuntime the first token is one
prefill and each further position one token step; a ScoringRuntime (pipeline/runtime/scoring.py) gives every
row from the window's prefill. The window is the export stage's (its first `MAX_TOKENS` tokens), so the number
sits next to the export's `ppl_exported` in the build report."""

from __future__ import annotations

from raipack.data import heldout_text
from raipack.runtime.ortloop import perplexity

MAX_TOKENS = 256  # the most the window reads: [export].parity_tokens's full budget (raipack.runtime.budget, data/probes.json)


def heldout_ids(tokenizer, limit: int) -> list[int]:
    """The held-out text's first token ids, at most MAX_TOKENS and `limit`."""

    return list(tokenizer(heldout_text())["input_ids"])[: min(MAX_TOKENS, limit)]


def package_perplexity(runtime, ids: list[int]) -> float:
    """exp(mean NLL) of ids[1:] under the rows the runtime gives: a ScoringRuntime's `rows` (one prefill), else
    prefill(ids[:1]), then one step per id."""
    import numpy as np

    if getattr(runtime, "all_rows", False):
        return perplexity(runtime.rows(ids), ids)
    rows = [runtime.prefill(ids[:1]).copy()]
    rows += [runtime.step(int(t)).copy() for t in ids[1:-1]]
    return perplexity(np.stack(rows + [rows[-1]]), ids)  # perplexity() drops the last row
