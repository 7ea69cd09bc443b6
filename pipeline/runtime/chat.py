"""Prompts in and answers out of a package: tokenizer, chat template, timing."""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from pathlib import Path

from raipack.core.errors import RaipackError
from raipack.runtime.trust import first_line


def load_tokenizer(pkg: Path):
    """The package's tokenizer (no code from the package: trust_remote_code=False); RaipackError when broken."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(pkg), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # tokenizers and transformers raise Exception, ValueError, OSError, ... for broken files
        raise RaipackError(f"the tokenizer of {pkg} cannot be loaded (tokenizer.json, tokenizer_config.json): {first_line(exc)}",
                           "copy the package's tokenizer files again, or rebuild the package") from None


def chat_ids(tokenizer, text: str, chat: bool = True) -> list[int]:
    """Token ids of `text`, through the chat template when the tokenizer has one."""
    try:
        if chat and getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        return list(tokenizer(text)["input_ids"])
    except Exception as exc:  # a broken chat template (jinja2) or tokenizer
        raise RaipackError(f"the package's tokenizer or chat template cannot encode the prompt: {first_line(exc)}", "rebuild the package (raipack run --raw skips the chat template)") from None


@dataclass
class Timed:
    tokens: list[int]
    ttft: float  # seconds to the first new token (prefill)
    decode_tps: float  # new tokens per second after the first
    finite: bool  # every logits row was finite


def timed_generate(runtime, ids: list[int], max_new_tokens: int, stop_at_eos: bool = True) -> Timed:
    """Greedy decode with the prefill and per-token times measured apart."""
    import numpy as np

    t0 = time.perf_counter()
    row = runtime.prefill(ids)
    ttft = time.perf_counter() - t0
    finite = bool(np.isfinite(row).all())
    tokens = [int(np.argmax(row))]
    t1 = time.perf_counter()
    while len(tokens) < max_new_tokens and not (stop_at_eos and tokens[-1] in runtime.eos_token_ids):
        row = runtime.step(tokens[-1])
        finite = finite and bool(np.isfinite(row).all())
        tokens.append(int(np.argmax(row)))
    steps = len(tokens) - 1
    tps = steps / (time.perf_counter() - t1) if steps else 0.0
    return Timed(tokens, ttft, tps, finite)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
