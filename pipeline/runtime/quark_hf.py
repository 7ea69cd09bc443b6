"""A Quark export loaded in transformers, made fast to run: its weight-only linears dequantized once.

Used by the quantize stage's quality probe and the export stage's parity, which both reload a Quark
export through transformers' built-in Quark support. torch is imported inside the function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def dequantize_once(model: Any, dtype: str = "float32", after_each: Callable[[], object] | None = None) -> int:
    """Swap Quark's weight-only `QParamsLinear` modules (which dequantize their packed weight on
    every call) for `nn.Linear` holding that same dequantized weight, in `dtype` (a torch dtype's
    name: the quantize stage's, so its probes of an 8B model hold 16 GB of bfloat16 linears, not
    32 GB of float32). In float32 the forward is the same `F.linear` on the same tensor, so logits
    do not change; decoding gets ~10x faster. Returns the number of modules swapped; modules with
    activation quantizers are left alone. ``after_each()`` runs after each swap (the quantize stage's probe
    returns the freed heap there, heap.trim_heap)."""
    import torch
    from torch import nn

    fast_dequantize(model)  # the supported linears' _get_qweight reads them 3x faster, bit-identical
    swapped = 0
    for name, mod in list(model.named_modules()):
        if type(mod).__name__ != "QParamsLinear" or not hasattr(mod, "_get_qweight"):
            continue
        if getattr(mod, "input_quantizer", None) is not None or getattr(mod, "output_quantizer", None) is not None:
            continue
        with torch.no_grad():
            weight = mod._get_qweight(mod.weight).to(getattr(torch, dtype)).contiguous()
            bias = mod._get_qbias(mod.bias) if hasattr(mod, "_get_qbias") else None
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")  # no float32 buffer allocated first
        linear.weight = nn.Parameter(weight, requires_grad=False)
        if bias is not None:
            linear.bias = nn.Parameter(bias.to(weight.dtype), requires_grad=False)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, linear)
        # the packed module goes now, not at the next garbage collection: fast_dequantize's reader refers back
        # to it (a cycle), and at 8B the packed linears held until the end were 3.3 GiB beside their 13 GiB
        # of bfloat16 copies
        mod.__dict__.pop("_get_qweight", None)
        mod._parameters.clear()
        del mod
        swapped += 1
        if after_each is not None:
            after_each()
    return swapped


# --------------------------------------------------------------------------- a faster dequantization

# Quark's "reorder" packing puts eight 4-bit values into an int32 in the nibble order 0, 2, 4, 6, 1, 3, 5, 7
# (quark/torch/utils/pack.py: Pack_4_bits.pack); unpacking reads value k from nibble _ORDER[k].
_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def _supported(mod: Any) -> bool:
    """A weight-only QParamsLinear whose weight is Quark's packed uint4, asymmetric, per group, "reorder"
    layout (AMD's NPU scheme): the one layout ``_dequantize`` reads; anything else keeps Quark's code."""
    import torch

    wq = getattr(mod, "weight_quantizer", None)
    spec = getattr(wq, "qspec", None)
    if wq is None or spec is None or getattr(mod, "_quant_dict", None) is not None:
        return False
    if getattr(mod, "input_quantizer", None) is not None or getattr(mod, "output_quantizer", None) is not None:
        return False
    scale, zp, w = getattr(wq, "scale", None), getattr(wq, "zero_point", None), mod.weight
    return (getattr(wq, "real_quantized", False) and getattr(wq, "reorder", False) and getattr(wq, "transpose_scale", False)
            and getattr(spec.dtype, "value", None) == "uint4" and getattr(spec.qscheme, "value", None) == "per_group"
            and spec.ch_axis in (-1, 1) and isinstance(spec.group_size, int) and spec.group_size > 0
            and "float32" not in str(getattr(spec, "zero_point_type", "") or "").lower()
            and w.dtype == torch.int32 and w.dim() == 2 and isinstance(scale, torch.Tensor) and scale.dim() == 2
            and isinstance(zp, torch.Tensor) and zp.dtype == torch.int32 and zp.dim() == 2
            and w.shape[0] == scale.shape[0] * spec.group_size and w.shape[1] * 8 >= scale.shape[1])


def _unpack(packed: Any, columns: int) -> Any:
    """int32 [rows, n] in Quark's reorder layout -> int32 [rows, columns] of values 0..15."""
    import torch

    shifts = torch.tensor([4 * o for o in _ORDER], dtype=torch.int32, device=packed.device)
    x = packed.unsqueeze(-1) >> shifts
    x &= 0xF
    return x.reshape(packed.shape[0], -1)[:, :columns]


def dequantize_packed(packed: Any, scale: Any, zero_point: Any) -> Any:
    """The float weight [out, in] of a packed uint4 tensor (int32 [in, out / 8], Quark's reorder layout), its scales
    [in / group, out] and zero points (int32 [in / group, out / 8]): (q - zero point) x scale per group in the scales'
    dtype, the same arithmetic as Quark's kernel (bit-identical, tests/test_stages/test_quantize.py) in a third of its
    time (unpacked in int32 rather than through int64 and int8, no transposed copy: the result is a transposed view)."""
    groups, out = scale.shape
    q = _unpack(packed, out)  # [in, out]
    zp = _unpack(zero_point, out).to(scale.dtype)  # [in / group, out]
    w = q.view(groups, -1, out).to(scale.dtype)
    w -= zp.unsqueeze(1)
    w *= scale.unsqueeze(1)
    return w.reshape(-1, out).t()


def _dequantize(mod: Any) -> Any:
    """The float32 weight [out, in] of a ``_supported`` module (Quark stores per-group weights transposed)."""
    wq = mod.weight_quantizer
    return dequantize_packed(mod.weight.data, wq.scale, wq.zero_point)


def fast_dequantize(model: Any) -> dict[str, int]:
    """Make Quark's uint4 weight-only linears dequantize per call with ``_dequantize`` instead of Quark's
    unpack (3x faster; parity dequantizes every linear on every forward, 0.5 s per 8B down_proj with
    Quark's code). Installed only when the first such linear's weight comes out bit-identical to Quark's
    own; otherwise nothing changes. Returns {"modules": installed, "quark": left to Quark's code}."""
    import torch

    mods = [m for m in model.modules() if type(m).__name__ == "QParamsLinear" and hasattr(m, "_get_qweight")]
    fast = [m for m in mods if _supported(m)]
    if fast:
        with torch.no_grad():
            if not torch.equal(fast[0]._get_qweight(fast[0].weight), _dequantize(fast[0])):
                return {"modules": 0, "quark": len(mods)}
        for m in fast:
            m._get_qweight = lambda x, _m=m: _dequantize(_m)
    return {"modules": len(fast), "quark": len(mods) - len(fast)}
