"""Pure functions over an ONNX graph loaded without its weights.

Each returns a list of {"pointer", "message", "hint"[, "severity"]} dicts; an
empty list means the graph is fine. Used by the validate checks (RP702-RP704)
and by the export stage's output checks.
"""

from __future__ import annotations

import os
from pathlib import Path

from onnx import TensorProto

INT_TYPES = {TensorProto.INT64, TensorProto.INT32}
FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}
TYPE_NAME = {v: k.lower() for k, v in TensorProto.DataType.items()}


def _item(pointer: str, message: str, hint: str, severity: str | None = None) -> dict:
    item = {"pointer": pointer, "message": message, "hint": hint}
    if severity:
        item["severity"] = severity
    return item


def external_data_refs(model, base_dir: Path, root: Path | None = None) -> list[dict]:
    """Every external-data initializer points inside `root` at bytes that exist."""
    base_dir = Path(base_dir)
    real_root = os.path.realpath(root or base_dir)
    sizes: dict[str, int | None] = {}
    out = []
    for init in model.graph.initializer:
        if init.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in init.external_data}
        loc = info.get("location", "")
        norm = loc.replace("\\", "/")
        if not loc or norm.startswith("/") or ".." in norm.split("/") or (len(norm) > 1 and norm[1] == ":"):
            out.append(_item(init.name, f"tensor {init.name} stores its data at {loc!r}, a path outside the package", "re-export the model with its external data beside the graph"))
            continue
        target = os.path.realpath(base_dir / norm)
        if os.path.commonpath([real_root, target]) != real_root:
            out.append(_item(init.name, f"tensor {init.name} stores its data at {loc!r}, which resolves outside the package", "copy the data file into the package"))
            continue
        if loc not in sizes:
            try:
                sizes[loc] = os.stat(target).st_size
            except OSError:
                sizes[loc] = None
        size = sizes[loc]
        if size is None:
            out.append(_item(init.name, f"tensor {init.name} stores its data in {loc}, which is missing", f"copy {loc} into the package"))
            continue
        try:
            offset, length = int(info.get("offset", 0)), int(info.get("length", -1))
        except ValueError:
            out.append(_item(init.name, f"tensor {init.name} has a non-numeric offset or length", "re-export the model"))
            continue
        if length < 0:
            length = size - offset
        if offset < 0 or offset + length > size:
            out.append(_item(init.name, f"tensor {init.name} needs bytes {offset}..{offset + length} of {loc}, which has only {size} bytes", f"{loc} is truncated or from another export; copy it again"))
    return out


def _dims(vi) -> list:
    t = vi.type.tensor_type
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim] if t.HasField("shape") else []


def _names(template: str, layers: int) -> list[str]:
    return [template % i for i in range(layers)] if "%d" in template else [template]


def io_contract(model, genai: dict) -> list[dict]:
    """The graph's inputs/outputs match what genai_config.json declares."""
    out = []
    mdl = genai.get("model") if isinstance(genai.get("model"), dict) else {}
    dec = mdl.get("decoder") if isinstance(mdl.get("decoder"), dict) else {}
    ins = dec.get("inputs") if isinstance(dec.get("inputs"), dict) else {}
    outs = dec.get("outputs") if isinstance(dec.get("outputs"), dict) else {}
    layers = dec.get("num_hidden_layers")
    kv_heads, head_size, vocab = dec.get("num_key_value_heads"), dec.get("head_size"), mdl.get("vocab_size")
    g_in = {vi.name: vi for vi in model.graph.input}
    g_out = {vi.name: vi for vi in model.graph.output}
    if not isinstance(layers, int):
        return out

    def want(table, names, key, where, kind):
        for name in names:
            if name not in table:
                out.append(_item(name, f"the graph has no {kind} {name!r}, which genai_config.json declares at /model/decoder/{where}/{key}", "use the genai_config.json written with this graph, or re-export"))

    for key, kind_types in (("input_ids", INT_TYPES), ("attention_mask", INT_TYPES), ("position_ids", INT_TYPES)):
        if isinstance(ins.get(key), str):
            want(g_in, [ins[key]], key, "inputs", "input")
            vi = g_in.get(ins[key])
            if vi is not None and vi.type.tensor_type.elem_type not in kind_types:
                out.append(_item(vi.name, f"input {vi.name} is {TYPE_NAME.get(vi.type.tensor_type.elem_type)}; expected int64 or int32", "re-export the model"))
    kv = []
    for key in ("past_key_names", "past_value_names"):
        if isinstance(ins.get(key), str):
            names = _names(ins[key], layers)
            want(g_in, names, key, "inputs", "input")
            kv += [g_in[n] for n in names if n in g_in]
            prefix = ins[key].split("%d")[0]
            extra = [n for n in g_in if n.startswith(prefix) and n not in names and n.endswith(ins[key].split("%d")[-1])]
            if extra:
                out.append(_item(extra[0], f"the graph has {len(extra)} more KV-cache inputs than the {layers} layers genai_config.json declares", "num_hidden_layers in genai_config.json must match the graph"))
    for key in ("present_key_names", "present_value_names"):
        if isinstance(outs.get(key), str):
            names = _names(outs[key], layers)
            want(g_out, names, key, "outputs", "output")
            kv += [g_out[n] for n in names if n in g_out]
    if isinstance(outs.get("logits"), str):
        want(g_out, [outs["logits"]], "logits", "outputs", "output")
        vi = g_out.get(outs["logits"])
        if vi is not None:
            dims = _dims(vi)
            if dims and isinstance(dims[-1], int) and dims[-1] and isinstance(vocab, int) and dims[-1] != vocab:
                out.append(_item(vi.name, f"output {vi.name} has {dims[-1]} columns; genai_config.json says vocab_size {vocab}", "use the genai_config.json written with this graph"))
    types = {vi.type.tensor_type.elem_type for vi in kv}
    if len(types) > 1:
        out.append(_item(kv[0].name, f"KV-cache tensors mix element types ({', '.join(sorted(TYPE_NAME.get(t, '?') for t in types))})", "re-export the model"))
    for vi in kv:
        dims = _dims(vi)
        if vi.type.tensor_type.elem_type not in FLOAT_TYPES:
            out.append(_item(vi.name, f"{vi.name} is {TYPE_NAME.get(vi.type.tensor_type.elem_type)}; expected float, float16 or bfloat16", "re-export the model"))
        if len(dims) != 4:
            if dims:
                out.append(_item(vi.name, f"{vi.name} has {len(dims)} dimensions; expected 4 (batch, kv heads, sequence, head size)", "re-export the model"))
            continue
        if isinstance(dims[1], int) and isinstance(kv_heads, int) and dims[1] != kv_heads:
            out.append(_item(vi.name, f"{vi.name} has {dims[1]} KV heads; genai_config.json says num_key_value_heads {kv_heads}", "use the genai_config.json written with this graph"))
        if isinstance(dims[3], int) and isinstance(head_size, int) and dims[3] != head_size:
            out.append(_item(vi.name, f"{vi.name} has head size {dims[3]}; genai_config.json says head_size {head_size}", "use the genai_config.json written with this graph"))
    return out


def _is_excluded(node_name: str, excluded: list[str]) -> bool:
    flat = node_name.replace("/", ".").strip(".")
    for ex in excluded:
        ex = ex.strip("*").strip(".")
        if ex and (ex in flat or ex.replace(".", "/") in node_name):
            return True
    return False


def matmulnbits_agreement(model, quant_config: dict | None, rules: dict) -> list[dict]:
    """MatMulNBits nodes carry Quark's bits/group size/zero points; excluded layers stay float."""
    out = []
    weight = {}
    excluded: list[str] = []
    if isinstance(quant_config, dict):
        weight = (quant_config.get("global_quant_config") or {}).get("weight") or {}
        if isinstance(weight, list):
            weight = weight[0] if weight else {}
        excluded = [e for e in quant_config.get("exclude") or [] if isinstance(e, str)]
    group = weight.get("group_size") if isinstance(weight.get("group_size"), int) else rules.get("group_size")
    bits_want = rules.get("bits", 4)
    dtype = weight.get("dtype")
    if isinstance(dtype, str) and dtype[-1:].isdigit():
        bits_want = int("".join(c for c in dtype if c.isdigit()))
    symmetric = weight.get("symmetric", rules.get("symmetric"))
    source = "the Quark quantization_config" if weight else "the profile"
    for node in model.graph.node:
        if node.op_type == "GatherBlockQuantized" and _is_excluded("lm_head", excluded):
            out.append(_item(node.name, f"node {node.name} reads a block-quantized embedding shared with lm_head, which Quark excluded from quantization", "export with nodes_to_exclude=/lm_head/MatMul,/model/embed_tokens/Gather (raipack's export stage does)"))
        if node.op_type != "MatMulNBits":
            continue
        attrs = {a.name: a.i for a in node.attribute}
        if _is_excluded(node.name, excluded):
            out.append(_item(node.name, f"node {node.name} is quantized ({attrs.get('bits')}-bit, block {attrs.get('block_size')}) but Quark excluded that layer", "export with the builder's nodes_to_exclude for excluded layers (raipack's export stage does)"))
            continue
        if attrs.get("bits") != bits_want:
            out.append(_item(node.name, f"node {node.name} has bits={attrs.get('bits')}; {source} says {bits_want}", "re-export from the Quark checkpoint without re-quantizing"))
        if group and attrs.get("block_size") != group:
            out.append(_item(node.name, f"node {node.name} has block_size={attrs.get('block_size')}; {source} says group size {group}", "re-export from the Quark checkpoint without re-quantizing"))
        has_zp = len(node.input) > 3 and node.input[3] != ""
        if symmetric is False and not has_zp:
            out.append(_item(node.name, f"node {node.name} has no zero points but {source} is asymmetric", "re-export from the Quark checkpoint; the zero points were dropped"))
    return out
