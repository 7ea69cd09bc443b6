"""A Quark export of AMD's NPU scheme loaded as a plain transformers model, without importing Quark.

The export stage's parity runs the Quark model in transformers beside the exported graph. transformers reads a
Quark checkpoint through Quark, whose import (its torch extension, its modules) was about 3 s of the 1B export's
parity of 17 s (issue 41, session 16), a fixed cost beside a 25-second model builder. For the scheme AMD's NPU
packages use (uint4 weights per group, a zero point per group, Quark's "reorder" packing, weight-only) this
module builds the model from its config without the quantization, then puts in each quantized linear a
`PackedLinear` that keeps the packed weight and dequantizes it on every call, as Quark's `QParamsLinear` does (an
8B model's linears in float32 would be 28 GB), with raipack's reader of the packing
(`raipack.runtime.quark_hf.dequantize_packed`): the same float32 weight bit for bit as Quark's own, and the same
`F.linear`, so the logits equal those of the model loaded through Quark (tests/test_stages/test_export.py).

Anything else returns None and the caller loads through Quark: another data type, scheme or packing, activation
or output quantizers, per-layer configs, a tensor the model does not name or of another shape, a parameter the file
does not give. Nothing from the folder runs (no remote code: the architecture is transformers' own)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from raipack.npu.quark_config import plain_group_size
from raipack.runtime.quark_hf import dequantize_packed

SCALE, ZERO = ".weight_scale", ".weight_zero_point"


@functools.cache
def _packed_linear_class():
    import torch
    from torch import nn

    class PackedLinear(nn.Module):
        """A linear whose weight stays packed (uint4 in int32, Quark's "reorder" layout) and is dequantized per call."""

        def __init__(self, packed: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, bias: torch.Tensor | None):
            super().__init__()
            self.register_buffer("packed", packed, persistent=False)
            self.register_buffer("scale", scale, persistent=False)
            self.register_buffer("zero_point", zero_point, persistent=False)
            self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            weight = dequantize_packed(self.packed, self.scale, self.zero_point).to(x.dtype)
            return nn.functional.linear(x, weight, None if self.bias is None else self.bias.to(x.dtype))

    return PackedLinear


def load_plain(folder: str | Path, dtype: str = "float32") -> Any | None:
    """The Quark export in `folder` as a transformers model in `dtype` (eval mode, on the CPU) whose quantized linears
    are `PackedLinear`s, or None when its config or tensors are not the scheme this reads (see the module's note)."""
    folder = Path(folder)
    try:
        doc = json.loads((folder / "config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    weights = folder / "model.safetensors"  # one file: a sharded export goes through Quark
    if not isinstance(doc, dict) or plain_group_size(doc.get("quantization_config")) is None or not weights.is_file():
        return None
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers < 5
        return None
    try:
        config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False, local_files_only=True)
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        with no_init_weights():  # parameters allocated, not initialized: every one is filled from the file below or refused
            model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype), trust_remote_code=False)
    except (ValueError, KeyError, OSError):  # an architecture transformers does not know: the Quark path says so in its words
        return None
    model.tie_weights()  # a tied lm_head is the embedding's parameter before it is filled (from_config leaves it apart here)
    with safe_open(str(weights), framework="pt") as fh:
        ok = _fill(model, fh, getattr(torch, dtype))
    return model.eval() if ok else None


def _fill(model: Any, fh: Any, dtype: Any) -> bool:
    """Puts every tensor of the open safetensors file `fh` into `model`; False (the model half-filled, to be dropped) at
    the first tensor it cannot place, or when a parameter is left unfilled."""
    keys = set(fh.keys())
    quantized = sorted(k[: -len(SCALE)] for k in keys if k.endswith(SCALE))
    placed = set()
    for name in quantized:
        if not _swap_linear(model, fh, name, dtype, keys):
            return False
        placed |= {f"{name}.weight", name + SCALE, name + ZERO} | ({f"{name}.bias"} & keys)
    params = dict(model.named_parameters(remove_duplicate=False))
    filled = set()
    for key in sorted(keys - placed):
        param = params.get(key)
        if param is None:
            return False
        tensor = fh.get_tensor(key)
        if not tensor.is_floating_point() or tuple(tensor.shape) != tuple(param.shape):
            return False
        param.data = tensor.to(dtype)
        filled.add(id(param))
    left = [n for n, p in model.named_parameters() if id(p) not in filled]  # shared (tied) parameters once
    return not left


def _swap_linear(model: Any, fh: Any, name: str, dtype: Any, keys: set) -> bool:
    import torch

    try:
        linear = model.get_submodule(name)
    except AttributeError:
        return False
    if not isinstance(linear, torch.nn.Linear) or f"{name}.weight" not in keys or name + ZERO not in keys:
        return False
    packed, scale, zero = fh.get_tensor(f"{name}.weight"), fh.get_tensor(name + SCALE), fh.get_tensor(name + ZERO)
    out, inp = linear.out_features, linear.in_features
    columns = -(-out // 8)
    if packed.dtype != torch.int32 or zero.dtype != torch.int32 or not scale.is_floating_point():
        return False
    if tuple(packed.shape) != (inp, columns) or scale.dim() != 2 or scale.shape[1] != out or inp % scale.shape[0]:
        return False
    if tuple(zero.shape) != (scale.shape[0], columns):
        return False
    bias = fh.get_tensor(f"{name}.bias").to(dtype) if f"{name}.bias" in keys else None
    if (bias is None) != (linear.bias is None):
        return False
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, _packed_linear_class()(packed, scale.to(dtype), zero, bias))
    return True
