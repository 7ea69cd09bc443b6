"""Quality probes for a Hugging Face causal LM folder: perplexity and a greedy answer.

Works for the float32 source and for Quark exports (transformers reads a
``quantization_config`` with ``quant_method: quark`` through its built-in support).
Remote code is never trusted. Heavy imports happen inside the functions.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from raipack.core.errors import RaipackError

HINT = 'check that the folder holds a Hugging Face model with its tokenizer (re-run the stage that wrote it with --force)'


def load_hf(model_dir: Path, *, dtype: str = "float32") -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a folder, the source or a Quark export, on CPU, eval mode, its
    float tensors in ``dtype`` (a Quark export's packed weights stay packed: dequantize_once casts them)."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise RaipackError(f"{model_dir}: no config.json; expected a Hugging Face model folder", HINT)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = json.loads((model_dir / "config.json").read_text())
    quant = (cfg.get("quantization_config") or {}).get("quant_method")
    kwargs: dict[str, Any] = {"trust_remote_code": False, "local_files_only": True, "dtype": getattr(torch, dtype)}
    if quant == "quark":  # transformers imports quark, which may compile its extension: never hang on a killed build's lock
        # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
        from raipack.stages.quark_import import import_quark

        import_quark()
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False, local_files_only=True)
    model.eval()
    return model, tokenizer


def perplexity(model: Any, tokenizer: Any, text: str, max_len: int = 1024, stride: int | None = None, max_tokens: int | None = None) -> float:
    """Perplexity of ``text`` (exp of mean token NLL), windows of ``max_len`` tokens; only its first
    ``max_tokens`` tokens when given (the probe's token budget).

    With ``stride`` < ``max_len`` windows overlap and only the new tokens of each window
    are scored (the usual sliding-window evaluation); by default windows do not overlap.
    """
    import math

    import torch

    if not text.strip():
        raise RaipackError("perplexity needs a non-empty text", HINT)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids[0][:max_tokens]
    if ids.numel() < 2:
        raise RaipackError(f"perplexity needs at least 2 tokens, the text has {ids.numel()}", HINT)
    stride = stride or max_len
    nll_sum, count, prev_end = 0.0, 0, 0
    with torch.inference_mode():
        for begin in range(0, ids.numel(), stride):
            end = min(begin + max_len, ids.numel())
            window = ids[begin:end].unsqueeze(0)
            logits = model(input_ids=window).logits[0, :-1].float()
            targets = window[0, 1:]
            # score only the targets not scored by an earlier window
            first_new = max(prev_end - begin - 1, 0)
            logp = torch.log_softmax(logits[first_new:], dim=-1)
            nll = -logp.gather(1, targets[first_new:].unsqueeze(1)).sum().item()
            nll_sum += nll
            count += targets.numel() - first_new
            prev_end = end
            if end == ids.numel():
                break
    return math.exp(nll_sum / count)


def greedy_answer(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int = 32) -> str:
    """Greedy completion of ``prompt``, through the chat template when the tokenizer has one."""
    import torch

    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        enc = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    else:
        enc = tokenizer(prompt, return_tensors="pt")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.inference_mode():
        out = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            temperature=None,
            top_p=None,
            top_k=None,
            pad_token_id=pad,
        )
    new = out[0, enc["input_ids"].shape[1]:]
    return tokenizer.decode(new, skip_special_tokens=True).strip()
