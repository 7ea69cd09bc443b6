"""A Quark export loaded in transformers, made fast to run: its weight-only linears dequantized once.

Used by the quantize stage's quality probe and the export stage's parity, which both reload a Quark
export through transformers' built-in Quark support. torch is imported inside the function.
"""

from __future__ import annotations

from typing import Any


def dequantize_once(model: Any, dtype: str = "float32") -> int:
    """Swap Quark's weight-only `QParamsLinear` modules (which dequantize their packed weight on
    every call) for `nn.Linear` holding that same dequantized weight, in `dtype` (a torch dtype's
    name: the quantize stage's, so its probes of an 8B model hold 16 GB of bfloat16 linears, not
    32 GB of float32). In float32 the forward is the same `F.linear` on the same tensor, so logits
    do not change; decoding gets ~10x faster. Returns the number of modules swapped; modules with
    activation quantizers are left alone."""
    import torch
    from torch import nn

    swapped = 0
    for name, mod in list(model.named_modules()):
        if type(mod).__name__ != "QParamsLinear" or not hasattr(mod, "_get_qweight"):
            continue
        if getattr(mod, "input_quantizer", None) is not None or getattr(mod, "output_quantizer", None) is not None:
            continue
        with torch.no_grad():
            weight = mod._get_qweight(mod.weight).to(getattr(torch, dtype))
            bias = mod._get_qbias(mod.bias) if hasattr(mod, "_get_qbias") else None
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")  # no float32 buffer allocated first
        linear.weight = nn.Parameter(weight, requires_grad=False)
        if bias is not None:
            linear.bias = nn.Parameter(bias.to(weight.dtype), requires_grad=False)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, linear)
        swapped += 1
    return swapped
