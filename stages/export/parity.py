"""Parity of an exported OGA model with the Quark model it came from.

The ONNX side runs through `raipack.runtime.ortloop.OrtDecoder` (plain onnxruntime); the reference side reloads
the Quark export in transformers: for AMD's NPU scheme as a plain transformers model whose linears dequantize Quark's
packing per call (`raipack.runtime.quark_plain`, without Quark's import), otherwise through Quark, which transformers
reads natively. The two models are loaded one after the
other, never held together. Both see the same token ids
(the Quark folder's tokenizer, no chat template).
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from raipack.runtime.heap import trim_heap
from raipack.runtime.ortloop import OrtDecoder, perplexity
from raipack.runtime.quark_hf import dequantize_once as _dequantize_once
from raipack.runtime.quark_hf import fast_dequantize
from raipack.runtime.quark_plain import load_plain


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    den = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / den) if den else float("nan")


def _hf_forced(model, ids: list[int], tokens: list[int]) -> "np.ndarray":
    """transformers' logits rows after `ids` and after each of `tokens` but the last ([len(tokens), V]
    float32), from one forward over ids + tokens[:-1]. Their argmax is transformers' greedy choice at
    each step along `tokens`."""
    return _hf_packed(model, [(list(ids) + list(tokens)[:-1], len(tokens))])[0]


def _hf_packed(model, segments: list[tuple[list[int], int]]) -> list["np.ndarray"]:
    """transformers' last `rows` logits rows of each `(token ids, rows)` segment ([rows, V] float32), from ONE
    forward: the segments are packed in one row with positions restarting at 0, which transformers (>= 5)
    reads as packed sequences and masks block by block, so each segment attends to itself only, as in a
    forward of its own. One forward dequantizes each of Quark's linears once for all segments (at 8B that
    dequantization is most of parity's time); the lm_head runs on the kept rows only (`logits_to_keep`)."""
    import inspect

    import torch

    ids = [t for seq, _ in segments for t in seq]
    positions = [i for seq, _ in segments for i in range(len(seq))]
    ends = np.cumsum([len(seq) for seq, _ in segments])
    keep = [i for (_, rows), end in zip(segments, ends) for i in range(int(end) - rows, int(end))]
    kwargs = {"logits_to_keep": torch.tensor(keep)} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), position_ids=torch.tensor([positions]), use_cache=False, **kwargs)
    logits = out.logits[0] if kwargs else out.logits[0, keep]
    rows = np.split(logits.float().numpy(), np.cumsum([r for _, r in segments])[:-1])
    return rows


def sample_positions(steps: int, size: int, seed: int = 0) -> list[int]:
    """The generated positions whose logits rows parity compares: the first (the prompt's last token),
    the last and `size` - 2 others drawn with a fixed seed; every position when `size` >= `steps`."""
    if size >= steps:
        return list(range(steps))
    middle = np.random.default_rng(seed).choice(np.arange(1, steps - 1), size=max(size - 2, 0), replace=False)
    return sorted({0, steps - 1, *(int(i) for i in middle)})


@dataclass(frozen=True)
class ParityOptions:
    steps: int = 16  # greedy steps per prompt (no EOS stop)
    positions: int = 8  # generated positions per prompt whose logits rows are compared (sample_positions)
    max_heldout_tokens: int = 256  # the held-out text's tokens the perplexity reads
    threads: int | None = None  # torch's and onnxruntime's threads (default: theirs)
    dequantize_once: bool = False  # dequantize Quark's weights once (float32 linears: 28 GB at 8B) instead of per call (same results and time since parity runs single forwards, not a decode loop: 14.6 vs 14.9 CPU-s on the example)


def parity(quark_dir: str | Path, onnx_dir: str | Path, prompts: list[str], heldout_text: str, options: ParityOptions | None = None, /,
           **fields) -> dict:
    """Compare the exported graph in `onnx_dir` with the Quark model in `quark_dir`.

    Per prompt: the export's greedy tokens over `steps` steps (no EOS stop; its own decode loop), checked
    against transformers along the prompt and those tokens (the argmax of each row is transformers'
    greedy choice there, so the first that differs is where greedy decoding diverges; the prompts and the
    held-out text go through transformers in one packed forward, _hf_packed);
    cosine similarity and max abs difference of the last prompt token's logits, and the lowest logit
    cosine over `positions` sampled generated positions (sample_positions: first, last, seeded others).
    Overall: perplexity of both on `heldout_text` (first `max_heldout_tokens` tokens). `fields` set ParityOptions' fields over `options`. Returns a JSON-able dict.
    """
    opts = replace(options or ParityOptions(), **fields)  # fields: ParityOptions' (steps=8)
    steps, max_heldout_tokens, threads = opts.steps, opts.max_heldout_tokens, opts.threads
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    if threads:
        torch.set_num_threads(int(threads))
    tokenizer = AutoTokenizer.from_pretrained(str(quark_dir))
    # One model at a time: the export's decoder first (its greedy tokens and perplexity), then the Quark model in
    # transformers, so the stage never holds both (at 8B each is several GiB beside the builder's leftovers).
    dec = OrtDecoder(onnx_dir, threads=threads)
    decoder_file = dec.genai["model"]["decoder"].get("filename", "model.onnx")
    t_loaded_onnx = time.perf_counter()
    held = tokenizer(heldout_text)["input_ids"][:max_heldout_tokens]
    if dec.context_length:
        held = held[: dec.context_length]
    greedy = []
    for prompt in prompts:
        ids = tokenizer(prompt)["input_ids"]
        greedy.append((ids, *dec.greedy(ids, steps)))
    ppl_onnx = perplexity(dec.logits(held), held)
    del dec
    gc.collect()
    trim_heap()
    t_onnx = time.perf_counter()

    # AMD's NPU scheme without Quark's import (quark_plain: the same weights and logits bit for bit); anything else,
    # or dequantize_once, through Quark in transformers
    model = None if opts.dequantize_once else load_plain(quark_dir)
    if model is not None:
        loader, swapped = "raipack", 0
        fast = {"modules": sum(type(m).__name__ == "PackedLinear" for m in model.modules())}
    else:
        # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
        from raipack.stages.quark_import import import_quark

        import_quark()  # transformers imports quark, which may compile its extension: never hang on a killed build's lock
        loader = "quark"
        model = AutoModelForCausalLM.from_pretrained(str(quark_dir), dtype=torch.float32).eval()
        swapped = _dequantize_once(model) if opts.dequantize_once else 0
        fast = fast_dequantize(model)  # per call, 3x faster than Quark's unpack; checked bit-identical on the first linear
    t_loaded_hf = time.perf_counter()
    # transformers along the export's tokens and over the held-out text: one forward for all (_hf_packed)
    *forced, h_logits = _hf_packed(model, [(list(ids) + list(o_tokens)[:-1], len(o_tokens)) for ids, o_tokens, _ in greedy] + [(held, len(held))])
    ppl_hf = perplexity(h_logits, held)
    del h_logits, model
    gc.collect()
    trim_heap()
    t_hf = time.perf_counter()

    results = []
    for prompt, (ids, o_tokens, o_rows), h_rows in zip(prompts, greedy, forced):
        h_choice = [int(t) for t in np.argmax(h_rows, axis=-1)]
        diverge = next((i for i, (a, b) in enumerate(zip(o_tokens, h_choice)) if a != b), None)
        sample = sample_positions(len(o_tokens), opts.positions)
        # transformers' greedy tokens up to the first that differs (after it, its rows follow the export's tokens)
        h_tokens = o_tokens if diverge is None else o_tokens[:diverge] + h_choice[diverge:diverge + 1]
        results.append({
            "prompt": prompt,
            "prompt_tokens": len(ids),
            "cosine": round(_cosine(o_rows[0], h_rows[0]), 6),
            "max_abs_diff": round(float(np.max(np.abs(o_rows[0] - h_rows[0]))), 6),
            "positions_compared": len(sample),
            # both rows of a position see the same tokens (the export's), so a row after a divergence compares too
            "min_step_cosine": round(min(_cosine(o_rows[i], h_rows[i]) for i in sample), 6),
            "greedy_identical": diverge is None,
            "first_divergence": diverge,
            "tokens_onnx": o_tokens,
            "tokens_transformers": h_tokens,
            "text_onnx": tokenizer.decode(o_tokens),
            "text_transformers": tokenizer.decode(h_tokens),
        })
    del greedy, forced

    import onnx

    proto = onnx.load(str(Path(onnx_dir) / decoder_file), load_external_data=False)
    levels = sorted({a.i for n in proto.graph.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "accuracy_level"})
    return {
        "steps": steps,
        "positions_compared": sum(r["positions_compared"] for r in results),  # logits rows compared, over all prompts
        # 4 = MatMulNBits quantizes activations to int8 on CPU (the builder's CPU default); 1 = float32,
        # which is what Quark's weight-only scheme computes. It dominates the logit difference.
        "matmulnbits_accuracy_levels": levels,
        "prompts": results,
        "cosine_min": min(r["cosine"] for r in results) if results else None,
        "max_abs_diff_max": max(r["max_abs_diff"] for r in results) if results else None,
        "greedy_identical": all(r["greedy_identical"] for r in results),
        "perplexity": {
            "onnx": round(ppl_onnx, 4),
            "transformers": round(ppl_hf, 4),
            "tokens": len(held),
            "ratio": round(ppl_onnx / ppl_hf, 5),
        },
        "reference_loader": loader,  # "raipack": raipack.runtime.quark_plain; "quark": transformers through Quark
        "dequantized_modules": swapped,
        "fast_dequantized_modules": fast["modules"],
        "seconds": round(time.perf_counter() - t0, 3),
        # where the time went: loading the two models (one after the other), the export's decode loops and
        # perplexity, transformers' one forward
        "seconds_load": round((t_loaded_onnx - t0) + (t_loaded_hf - t_onnx), 3),
        "seconds_onnx": round(t_onnx - t_loaded_onnx, 3),
        "seconds_transformers": round(t_hf - t_loaded_hf, 3),
    }
