"""Bound the memory of Quark's AWQ clipping search, with Quark's own code doing the search.

``AwqProcessor._compute_best_clip`` (Quark 0.13) multiplies the sampled inputs of a linear with a batch of
its weight rows in one step: a ``[rows x sampled tokens x in_features]`` temporary in the model's dtype,
with 256 rows when ``out_features`` is a multiple of 256. With the stage's 1024 calibration tokens (512
sampled) that is 3.5 GiB for Llama-3.1-8B's ``down_proj`` (14336 inputs), on top of the whole model,
and it is allocated and freed 20 times per batch. Each row's clipping bound depends only on that row's
weights (per-group quantization, per-row errors), so ``bounded_clip_search`` makes Quark's function see
the linear a few rows at a time (a view of the rows, the same quantizer) and stacks the answers: the same
bounds, bit for bit (tests/test_stages/test_awq_clip.py holds this against the unpatched function), with
a temporary of at most ``chunk_bytes`` (``data/memory.json``, ``awq_clip``).

It also gives the heap's free pages back before each layer's clipping search starts
(``runtime.trim_heap``): the scale search before it leaves its temporaries (about 2.8 GiB at 8B width,
below glibc's tuned mmap threshold, so in the heap) free but resident, and the clipping search's own
memory came on top of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from raipack.data import load_data
from raipack.runtime.heap import trim_heap


def clip_limits() -> dict[str, Any]:
    """The ``awq_clip`` constants of the memory model (``data/memory.json``): Quark's batch and sampling, raipack's chunk bound."""
    return dict(load_data("data/memory.json", "raipack.stages.quantize")["awq_clip"])


def sampled_tokens(tokens: int, sample_tokens: int) -> int:
    """How many of ``tokens`` calibration tokens Quark's clipping search keeps (every ``tokens // sample_tokens``-th)."""
    if tokens <= 0:
        return 0
    return math.ceil(tokens / max(1, tokens // min(tokens, sample_tokens)))


def rows_per_call(out_features: int, in_features: int, sampled: int, element_bytes: int, limits: dict[str, Any]) -> int:
    """How many weight rows Quark's search sees at once so that its product stays within ``chunk_bytes``:
    at least 1, at most Quark's own batch for this linear."""
    quark_batch = limits["out_channel_batch"] if out_features % limits["out_channel_batch"] == 0 else limits["out_channel_batch_fallback"]
    per_row = max(1, sampled * in_features * element_bytes)
    return max(1, min(quark_batch, out_features, limits["chunk_bytes"] // per_row))


def _row_view(linear: Any, start: int, stop: int) -> Any:
    """A module Quark's search reads like ``linear``: the rows ``start:stop`` of its weight (a view, no copy) and
    the same weight quantizer (its observer is reset after every call, as Quark does)."""
    import torch

    view = torch.nn.Module()
    view.weight = linear.weight[start:stop]  # a plain tensor attribute: a view of the rows, nothing is copied
    view._weight_quantizer = linear._weight_quantizer
    return view


@contextmanager
def bounded_clip_search(limits: dict[str, Any] | None = None) -> Iterator[list[int]]:
    """While the block runs, Quark's AWQ clipping search works on at most ``rows_per_call`` rows at a time and
    starts each layer with the heap trimmed; yields a list that gets the rows per call of every linear searched."""
    import torch
    from quark.torch.algorithm.awq.awq import AwqProcessor

    limits = limits or clip_limits()
    original_compute, original_search = AwqProcessor._compute_best_clip, AwqProcessor._search_best_clip
    calls: list[int] = []

    def compute(self: Any, linear: Any, input_feat: Any, *args: Any, **kwargs: Any) -> Any:
        out_features, in_features = linear.weight.shape
        tokens = input_feat.numel() // max(1, input_feat.shape[-1])
        sampled = sampled_tokens(tokens, kwargs.get("n_sample_token", limits["sample_tokens"]))
        rows = rows_per_call(out_features, in_features, sampled, linear.weight.element_size(), limits)
        calls.append(rows)
        if rows >= out_features:
            return original_compute(self, linear, input_feat, *args, **kwargs)
        parts = [original_compute(self, _row_view(linear, start, min(start + rows, out_features)), input_feat, *args, **kwargs)
                 for start in range(0, out_features, rows)]
        return torch.cat(parts, dim=0)

    def search(self: Any, *args: Any, **kwargs: Any) -> Any:
        trim_heap()  # the scale search's freed temporaries, before the clipping search allocates its own
        return original_search(self, *args, **kwargs)

    AwqProcessor._compute_best_clip, AwqProcessor._search_best_clip = compute, search
    try:
        yield calls
    finally:
        AwqProcessor._compute_best_clip, AwqProcessor._search_best_clip = original_compute, original_search
