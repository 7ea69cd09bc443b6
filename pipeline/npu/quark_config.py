"""Readers of a Quark `quantization_config` (which layers it excluded, the weight spec of a layer)
and the map between Hugging Face module names and the onnxruntime-genai builder's node names, so
the export stage and the checks agree on one reading."""

from __future__ import annotations

import fnmatch
import re
from typing import Any

# --- Quark quantization_config -------------------------------------------------------------------

_GLOB = re.compile(r"[*?\[]")


def is_excluded(quant_config: dict, layer: str) -> bool:
    """True if Quark's `exclude` list (exact names or fnmatch patterns) covers module `layer`."""
    for pattern in quant_config.get("exclude") or []:
        if layer == pattern or (_GLOB.search(pattern) and fnmatch.fnmatch(layer, pattern)):
            return True
    return False


def _bits(dtype: str | None) -> int | None:
    m = re.search(r"(\d+)", dtype or "")
    return int(m.group(1)) if m else None


def layer_weight_spec(quant_config: dict, layer: str) -> dict | None:
    """Quark's weight spec for module `layer` ("" = the global one): {dtype, bits, group_size, symmetric}.

    None when the layer is excluded or has no weight quantization. `layer_quant_config` entries (exact
    name, then fnmatch pattern) win over the global config, as in Quark.
    """
    if layer and is_excluded(quant_config, layer):
        return None
    layer_cfg = quant_config.get("layer_quant_config") or {}
    chosen = None
    if layer:
        chosen = layer_cfg.get(layer)
        if chosen is None:
            for pattern, cfg in layer_cfg.items():
                if fnmatch.fnmatch(layer, pattern):
                    chosen = cfg
                    break
    if chosen is None:
        chosen = quant_config.get("global_quant_config") or {}
    weight = (chosen or {}).get("weight")
    if isinstance(weight, list):  # several specs per tensor (mixed schemes): the first integer one
        weight = next((w for w in weight if w and _bits(w.get("dtype"))), None)
    if not weight:
        return None
    dtype = weight.get("dtype")
    symmetric = weight.get("symmetric")
    if symmetric is None:
        symmetric = not str(dtype or "").startswith("u")
    return {
        "dtype": dtype,
        "bits": _bits(dtype),
        "group_size": weight.get("group_size"),
        "symmetric": bool(symmetric),
    }


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def plain_group_size(quantization_config: Any) -> int | None:
    """The group size when a Quark `quantization_config` is the scheme `load_plain` reads (uint4, per group along the
    input, zero point in int32, weight-only, "reorder" packing, no per-layer configs), else None."""
    qc = _object(quantization_config)
    glob = _object(qc.get("global_quant_config"))
    weight, export = _object(glob.get("weight")), _object(qc.get("export"))
    group = weight.get("group_size")
    plain = (qc.get("quant_method") == "quark" and export.get("pack_method") == "reorder" and export.get("weight_format") == "real_quantized"
             and not export.get("weight_merge_groups") and not export.get("kv_cache_group")
             and weight.get("dtype") == "uint4" and weight.get("qscheme") == "per_group" and weight.get("ch_axis") in (-1, 1)
             and weight.get("zero_point_type") == "int32" and weight.get("scale_type") == "float" and not weight.get("is_dynamic")
             and weight.get("mx_element_dtype") is None and weight.get("block_size") is None and weight.get("scale_format") is None
             and all(glob.get(k) is None for k in ("input_tensors", "output_tensors", "bias"))
             and not qc.get("layer_quant_config") and not qc.get("layer_type_quant_config") and not qc.get("kv_cache_quant_config")
             and qc.get("softmax_quant_spec") is None and isinstance(group, int) and not isinstance(group, bool) and group > 0)
    return group if plain else None


# --- names: Hugging Face module <-> builder node ---------------------------------------------------

_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)$")
_NODE = re.compile(r"^/model/layers\.(\d+)/(attn|mlp)/(\w+)/[^/]+$")
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def hf_to_node(module: str) -> str | None:
    """The builder's float MatMul node name for a HF linear module (what `nodes_to_exclude` takes)."""
    if module == "lm_head":
        return "/lm_head/MatMul"
    m = _HF_LAYER.match(module)
    if not m:
        return None
    part = "attn" if m.group(2) == "self_attn" else "mlp"
    return f"/model/layers.{m.group(1)}/{part}/{m.group(3)}/MatMul"


def node_to_hf(node_name: str) -> list[str]:
    """HF module names behind a builder node (several for a packed qkv_proj / gate_up_proj)."""
    if node_name.startswith("/lm_head/"):
        return ["lm_head"]
    m = _NODE.match(node_name)
    if not m:
        return []
    layer, part, proj = m.groups()
    prefix = f"model.layers.{layer}.{'self_attn' if part == 'attn' else 'mlp'}."
    return [prefix + p for p in _FUSED.get(proj, (proj,))] + ([prefix + proj] if proj in _FUSED else [])
