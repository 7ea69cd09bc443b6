"""Try the package on the NPU through onnxruntime-genai and its RyzenAI provider.

Never reports a CPU run as an NPU run: the attempt either loads the model
with the package's own RyzenAI provider block and generates, or returns the
exact error onnxruntime-genai gave, in one line.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field


@dataclass
class NpuAttempt:
    ok: bool
    reason: str  # one line: why it did not run (the real error), or what ran
    tokens: list[list[int]] = field(default_factory=list)
    seconds: float = 0.0


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def try_npu(pkg_dir, prompts: list[list[int]], max_new_tokens: int) -> NpuAttempt:
    start = time.perf_counter()
    try:
        import onnxruntime_genai as og
    except ImportError as exc:
        return NpuAttempt(False, f"onnxruntime-genai is not installed ({first_line(exc)})")
    ep = os.environ.get("RYZENAI_EP_PATH")
    try:
        model = og.Model(str(pkg_dir))  # uses the package's provider_options: [{"RyzenAI": {...}}]
    except Exception as exc:  # OGA raises RuntimeError/OSError with the provider's own text
        where = f" (RYZENAI_EP_PATH={ep})" if ep else " (RYZENAI_EP_PATH is not set)"
        return NpuAttempt(False, first_line(exc) + where, seconds=time.perf_counter() - start)
    out = []
    try:
        for ids in prompts:
            params = og.GeneratorParams(model)
            params.set_search_options(max_length=len(ids) + max_new_tokens, do_sample=False)
            gen = og.Generator(model, params)
            gen.append_tokens(ids)
            new = []
            while not gen.is_done() and len(new) < max_new_tokens:
                gen.generate_next_token()
                new.append(int(gen.get_next_tokens()[0]))
            out.append(new)
    except Exception as exc:
        return NpuAttempt(False, f"the model loaded but generation failed: {first_line(exc)}", seconds=time.perf_counter() - start)
    return NpuAttempt(True, "onnxruntime-genai with the RyzenAI provider", out, time.perf_counter() - start)
