"""Pure checks of an OGA-shaped ONNX graph read without its weights.

Used by the validate checks RP702-RP704 (any package) and by the export
stage's output checks (stages/export/contract.py).

Every check returns a list of `Finding`s (severity error, path model.onnx): `pointer` names the
tensor, node or input at fault, `message` says in one sentence what was found and what was expected,
`hint` the next step. An empty list means the check passed. The graph checks take an
`ModelProto` loaded with `load_external_data=False` and never read weights. Where the graph keeps
its tensors outside itself is checked by pipeline/npu/external_data.py.

The Quark `quantization_config` readers and the Hugging Face module ↔ builder node names they
use are in pipeline/npu/quark_config.py, shared with the export stage.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from raipack.core.findings import Finding
from raipack.core.members import grouped
from raipack.core.onnxproto import ModelProto, TensorProto, get_attribute_value
from raipack.npu.quark_config import is_excluded, layer_weight_spec, node_to_hf
from raipack.npu.spec import Quantization

GRAPH = "model.onnx"  # the path of a contract finding; checks place it in their package

# --- findings ------------------------------------------------------------------------------------


def _f(check_id: str, pointer: str, message: str, hint: str) -> Finding:
    """A contract finding: `pointer` names the tensor, node or input at fault; the caller places it in its package."""
    return Finding(check_id, "error", GRAPH, message, hint, pointer)


_TYPE_NAMES = {v: k for k, v in TensorProto.DataType.items()}


def type_name(dt: int) -> str:
    return _TYPE_NAMES.get(dt, str(dt)).lower()


def _vinfo(v) -> tuple[int, list | None]:
    """(element type, dims: an int, a symbol or None each; None without a shape)."""
    t = v.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim] if t.HasField("shape") else None
    return t.elem_type, dims


_INT_TYPES = {TensorProto.INT64, TensorProto.INT32}
_KV_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.UINT8, TensorProto.INT8}


def io_contract(model: ModelProto, genai: dict) -> list[Finding]:
    """The graph's inputs and outputs against `model.decoder` of genai_config.json.

    Checks names (every configured name exists; no graph input the runtime would not feed), one
    past/present key and value per layer, dtypes (integer ids and mask, one float KV dtype shared by
    past and present), and the KV shape [batch, num_key_value_heads, seq, head_size] where the graph
    states it, falling back to GroupQueryAttention's attributes for symbolic dims.
    """
    try:
        dec = genai["model"]["decoder"]
        dims = _Dims(int(dec["num_hidden_layers"]), int(dec["num_key_value_heads"]), int(dec["head_size"]))
        q_heads = int(dec.get("num_attention_heads", 0)) or None
    except (KeyError, TypeError, ValueError) as err:
        return [_f("export.io", "genai_config.json#/model/decoder",
                   f"genai_config.json model.decoder lacks a usable {err} field",
                   "re-run the export; the builder writes num_hidden_layers, num_key_value_heads and head_size")]
    io = _GraphIO(model, dec.get("inputs") or {}, dec.get("outputs") or {})
    out = _named_io(io) + _id_dtypes(io)
    pk, pv = _layer_pattern(io.cfg_in, "past_key_names"), _layer_pattern(io.cfg_in, "past_value_names")
    ok, ov = _layer_pattern(io.cfg_out, "present_key_names"), _layer_pattern(io.cfg_out, "present_value_names")
    if pk is None or pv is None or ok is None or ov is None:
        out.append(_f("export.io", "genai_config.json#/model/decoder",
                      "genai_config.json lacks past_key_names/past_value_names/present_key_names/present_value_names with a %d",
                      "re-export; the builder writes 'past_key_values.%d.key' and 'present.%d.key' style names"))
        return out
    patterns = [(pk, io.g_in), (pv, io.g_in), (ok, io.g_out), (ov, io.g_out)]
    kv_dtypes: dict[str, int] = {}
    missing: dict[str, list[tuple[str, int]]] = {"input": [], "output": []}
    for pattern, src in patterns:
        out += _kv_tensors(io, pattern, src, dims, kv_dtypes, missing)
    out += _missing_kv(missing, dims)
    out += _kv_dtypes_agree(kv_dtypes, [pair for i in range(dims.layers) for pair in ((pk % i, ok % i), (pv % i, ov % i))])
    out += _undeclared_inputs(io) + _logits_vocab(io, genai)
    out.extend(_attention_heads(model, dims.kv_heads, q_heads, dims.head_size))
    return out


def _layer_pattern(cfg: dict, key: str) -> str | None:
    """A per-layer name of genai_config.json's inputs or outputs ('past_key_values.%d.key'), None when absent or without its %d."""
    value = cfg.get(key)
    return value if isinstance(value, str) and "%d" in value else None


class _Dims(NamedTuple):
    layers: int
    kv_heads: int
    head_size: int


class _GraphIO:
    """The graph's inputs and outputs by name, and the names genai_config.json declares."""

    def __init__(self, model: ModelProto, cfg_in: dict, cfg_out: dict):
        self.cfg_in, self.cfg_out = cfg_in, cfg_out
        self.g_in = {v.name: _vinfo(v) for v in model.graph.input}
        self.g_out = {v.name: _vinfo(v) for v in model.graph.output}
        self.init_names = {t.name for t in model.graph.initializer}
        self.expected_in: set[str] = set()  # graph inputs the runtime feeds


_HINT_NAMES = "rename the graph tensor or the genai_config.json entry so both agree (re-export is simplest)"


def _named_io(io: _GraphIO) -> list[Finding]:
    out = []
    for key, name in io.cfg_in.items():
        if not isinstance(name, str) or "%d" in name:
            continue
        io.expected_in.add(name)
        if name not in io.g_in:
            out.append(_f("export.io", name,
                          f"genai_config.json inputs.{key} names graph input '{name}', but the graph has no such input "
                          f"(it has {sorted(n for n in io.g_in if n not in io.init_names)[:6]})", _HINT_NAMES))
    for key, name in io.cfg_out.items():
        if isinstance(name, str) and "%d" not in name and name not in io.g_out:
            out.append(_f("export.io", name,
                          f"genai_config.json outputs.{key} names graph output '{name}', but the graph has no such output",
                          _HINT_NAMES))
    return out


def _id_dtypes(io: _GraphIO) -> list[Finding]:
    out = []
    for key in ("input_ids", "attention_mask", "position_ids"):
        name = io.cfg_in.get(key)
        if isinstance(name, str) and name in io.g_in and io.g_in[name][0] not in _INT_TYPES:
            out.append(_f("export.io", name, f"graph input '{name}' is {type_name(io.g_in[name][0])}, expected int64 or int32",
                          "re-export with the model builder; OGA feeds integer ids and masks"))
    if "input_ids" not in io.cfg_in and "inputs_embeds" not in io.cfg_in:
        out.append(_f("export.io", "genai_config.json#/model/decoder/inputs",
                      "genai_config.json model.decoder.inputs declares neither input_ids nor inputs_embeds",
                      "re-export; the builder declares input_ids"))
    return out


def _missing_kv(missing: dict[str, list[tuple[str, int]]], dims: _Dims) -> list[Finding]:
    """The missing past/present tensors, one finding per kind naming them compactly."""
    out = []
    for kind, names in missing.items():
        items = [_f("export.io", name, f"graph {kind} '{name}' for layer {i} is missing; genai_config.json declares {dims.layers} layers, "
                    f"each with a key and a value {kind}", "re-export, or fix num_hidden_layers / the name pattern in genai_config.json")
                 for name, i in names]
        out += grouped(items, f"graph {kind}s missing; genai_config.json declares {dims.layers} layers, each with a key and a value {kind}")
    return out


def _kv_tensors(io: _GraphIO, pattern: str, src: dict, dims: _Dims, kv_dtypes: dict, missing: dict[str, list[tuple[str, int]]]) -> list[Finding]:
    """One past/present name pattern: a tensor per layer, none beyond, each of a float dtype and the KV shape
    (the missing ones are added to `missing`)."""
    out = []
    kind = "input" if src is io.g_in else "output"
    rx = re.compile("^" + re.escape(pattern).replace("%d", r"(\d+)") + "$")
    found = {int(m.group(1)) for n in src if (m := rx.match(n))}
    for i in range(dims.layers):
        name = pattern % i
        if kind == "input":
            io.expected_in.add(name)
        if i not in found:
            missing[kind].append((name, i))
            continue
        kv_dtypes[name] = src[name][0]
        out += _kv_tensor(kind, name, src[name], dims)
    extra = sorted(i for i in found if i >= dims.layers)
    if extra:
        out.append(_f("export.io", pattern % extra[0],
                      f"graph has {kind}s for layers {extra[:5]} beyond num_hidden_layers={dims.layers} in genai_config.json",
                      "fix num_hidden_layers in genai_config.json or re-export"))
    return out


def _kv_tensor(kind: str, name: str, vinfo: tuple, dims: _Dims) -> list[Finding]:
    out = []
    dt, shape = vinfo
    if dt not in _KV_TYPES:
        out.append(_f("export.io", name, f"{kind} '{name}' is {type_name(dt)}, expected a float KV cache dtype",
                      "re-export with the model builder"))
    if shape is not None and len(shape) != 4:
        out.append(_f("export.io", name, f"{kind} '{name}' has rank {len(shape)}, expected 4 "
                      "[batch, kv_heads, sequence, head_size]", "re-export with the model builder"))
    elif shape is not None:
        if isinstance(shape[1], int) and shape[1] != dims.kv_heads:
            out.append(_f("export.io", name,
                          f"{kind} '{name}' has {shape[1]} KV heads (dim 1), genai_config.json says "
                          f"num_key_value_heads={dims.kv_heads}",
                          "fix num_key_value_heads in genai_config.json or re-export"))
        if isinstance(shape[3], int) and shape[3] != dims.head_size:
            out.append(_f("export.io", name,
                          f"{kind} '{name}' has head size {shape[3]} (dim 3), genai_config.json says head_size={dims.head_size}",
                          "fix head_size in genai_config.json or re-export"))
    return out


def _kv_dtypes_agree(kv_dtypes: dict, pairs: list[tuple[str, str]]) -> list[Finding]:
    """Each present tensor has its past tensor's dtype, and all share one."""
    out = []
    for p_name, o_name in pairs:
        if p_name in kv_dtypes and o_name in kv_dtypes and kv_dtypes[p_name] != kv_dtypes[o_name]:
            out.append(_f("export.io", o_name,
                          f"'{o_name}' is {type_name(kv_dtypes[o_name])} but '{p_name}' is {type_name(kv_dtypes[p_name])}; "
                          "present must feed back as past unchanged", "re-export with the model builder"))
    if len(set(kv_dtypes.values())) > 1 and not out:
        out.append(_f("export.io", next(iter(kv_dtypes)),
                      f"KV cache tensors use several dtypes {sorted({type_name(d) for d in kv_dtypes.values()})}, expected one",
                      "re-export with the model builder"))
    return out


def _undeclared_inputs(io: _GraphIO) -> list[Finding]:
    return [_f("export.io", name, f"graph input '{name}' is not declared in genai_config.json, so the runtime would not feed it",
               "declare it under model.decoder.inputs or re-export")
            for name in io.g_in if name not in io.expected_in and name not in io.init_names]


def _logits_vocab(io: _GraphIO, genai: dict) -> list[Finding]:
    logits = io.cfg_out.get("logits", "logits")
    vocab = genai.get("model", {}).get("vocab_size")
    if logits in io.g_out and vocab:
        dims = io.g_out[logits][1]
        if dims and isinstance(dims[-1], int) and dims[-1] != int(vocab):
            return [_f("export.io", logits, f"output '{logits}' has {dims[-1]} classes, genai_config.json says vocab_size={vocab}",
                       "fix vocab_size in genai_config.json or re-export")]
    return []


def _attention_heads(model, kv_heads: int, q_heads: int | None, head_size: int) -> list[Finding]:
    out = []
    producers = {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.op_type not in ("GroupQueryAttention", "MultiHeadAttention", "PagedAttention"):
            continue
        attrs = {a.name: get_attribute_value(a) for a in node.attribute}
        kv = attrs.get("kv_num_heads", attrs.get("num_heads"))
        if not isinstance(kv, (int, type(None))) or not isinstance(attrs.get("num_heads"), (int, type(None))):
            out.append(_f("export.io", node.name, f"{node.op_type} '{node.name}' has a head count attribute that is not an integer",
                          "re-export; the builder writes kv_num_heads and num_heads as integers"))
            continue
        if kv is not None and int(kv) != kv_heads:
            out.append(_f("export.io", node.name,
                          f"{node.op_type} '{node.name}' has kv_num_heads={kv}, genai_config.json says num_key_value_heads={kv_heads}",
                          "fix num_key_value_heads in genai_config.json or re-export"))
        nh = attrs.get("num_heads")
        if q_heads and nh is not None and int(nh) != q_heads:
            out.append(_f("export.io", node.name,
                          f"{node.op_type} '{node.name}' has num_heads={nh}, genai_config.json says num_attention_heads={q_heads}",
                          "fix num_attention_heads in genai_config.json or re-export"))
        # Head size: the projection feeding the query input packs (q + 2 kv) heads when K/V inputs are empty.
        src = producers.get(node.input[0]) if node.input else None
        if src is not None and src.op_type == "MatMulNBits" and nh is not None and kv is not None:
            n = {a.name: get_attribute_value(a) for a in src.attribute}.get("N")
            packed = len(node.input) < 3 or (not node.input[1] and not node.input[2])
            heads = int(nh) + 2 * int(kv) if packed else int(nh)
            if n and int(n) != heads * head_size:
                out.append(_f("export.io", node.name,
                              f"'{src.name}' feeds {node.op_type} with N={n} = {heads} heads x {int(n) / heads:g}, "
                              f"genai_config.json says head_size={head_size}",
                              "fix head_size in genai_config.json or re-export"))
    return out


# --- MatMulNBits against Quark -------------------------------------------------------------------


def matmulnbits_agreement(model: ModelProto, quant_config: dict | None, rules: Quantization | None = None) -> list[Finding]:
    """Each MatMulNBits must carry Quark's bits, group size and zero points; no layer Quark excluded
    (and no embedding, which Quark never quantizes) may be quantized; no layer Quark quantized may
    have become a float MatMul. Without a Quark config (AMD packages ship config.json = {}), only
    bits and block size are checked against the profile's `rules`."""
    if not quant_config:
        return _against_profile(model, rules) if rules is not None else []
    out: list[Finding] = []
    inits = {t.name for t in model.graph.initializer}
    for node in model.graph.node:
        attrs = {a.name: get_attribute_value(a) for a in node.attribute}
        layers = node_to_hf(node.name)
        if node.op_type == "MatMulNBits":
            excluded = [layer for layer in layers if is_excluded(quant_config, layer)]
            if excluded:
                out.append(_f("export.quant", node.name,
                              f"'{node.name}' is a {attrs.get('bits')}-bit MatMulNBits (block {attrs.get('block_size')}) "
                              f"but Quark excluded {excluded[0]} and kept it float",
                              "export with keep_excluded_float (the builder's nodes_to_exclude) so the layer stays float"))
                continue
            specs = [s for s in (layer_weight_spec(quant_config, layer) for layer in layers) if s] if layers else []
            spec = specs[0] if specs else layer_weight_spec(quant_config, "")
            if spec is None:
                continue
            bits, block = attrs.get("bits"), attrs.get("block_size")
            if spec["bits"] and bits != spec["bits"]:
                out.append(_f("export.quant", node.name,
                              f"'{node.name}' has bits={bits}, Quark quantized it to {spec['dtype']} ({spec['bits']} bits)",
                              "re-export from the Quark folder; do not re-quantize its weights"))
            if spec["group_size"] and block != spec["group_size"]:
                out.append(_f("export.quant", node.name,
                              f"'{node.name}' has block_size={block}, Quark used group_size={spec['group_size']}",
                              "re-export from the Quark folder; a different block size means the builder re-quantized it"))
            has_zp = len(node.input) > 3 and bool(node.input[3])
            if spec["symmetric"] is False and not has_zp:
                out.append(_f("export.quant", node.name,
                              f"'{node.name}' has no zero points, but Quark quantized it asymmetrically ({spec['dtype']})",
                              "re-export from the Quark folder; the builder's own symmetric quantization dropped Quark's zero points"))
            elif spec["symmetric"] is True and has_zp and str(spec["dtype"]).startswith("int"):
                out.append(_f("export.quant", node.name,
                              f"'{node.name}' carries zero points, but Quark quantized it symmetrically ({spec['dtype']})",
                              "re-export from the Quark folder"))
        elif node.op_type == "GatherBlockQuantized":
            out.append(_f("export.quant", node.name,
                          f"'{node.name}' gathers a {attrs.get('bits')}-bit block-{attrs.get('block_size')} embedding, "
                          "but Quark kept the token embedding float",
                          "export with keep_excluded_float so /model/embed_tokens/Gather and a tied lm_head stay float"))
        elif node.op_type == "MatMul" and layers and len(node.input) > 1 and node.input[1] in inits:
            quantized = [layer for layer in layers if layer_weight_spec(quant_config, layer)]
            if quantized and not any(is_excluded(quant_config, layer) for layer in layers):
                out.append(_f("export.quant", node.name,
                              f"'{node.name}' is a float MatMul, but Quark quantized {quantized[0]}",
                              "re-export from the Quark folder; the builder did not pick up its quantized weights"))
    return out


def _against_profile(model: ModelProto, rules: Quantization) -> list[Finding]:
    out: list[Finding] = []
    allowed = rules.group_sizes()
    for node in model.graph.node:
        if node.op_type != "MatMulNBits" or node.name.startswith("/lm_head/"):
            continue
        attrs = {a.name: get_attribute_value(a) for a in node.attribute}
        if attrs.get("bits") != rules.bits:
            out.append(_f("graph.quant", node.name, f"'{node.name}' has bits={attrs.get('bits')}; the profile expects {rules.bits}", "use a package built for this release"))
        if allowed and attrs.get("block_size") not in allowed:
            out.append(_f("graph.quant", node.name, f"'{node.name}' has block_size={attrs.get('block_size')}; the profile expects {' or '.join(map(str, allowed))}", "use a package built for this release"))
    return out
