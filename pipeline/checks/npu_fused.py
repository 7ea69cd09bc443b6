"""raipack reference packages: the fused graph and the cache files of its fused nodes agree with the
NPU header (RP903–RP904). The header is read once through npu/reference.py; see
checks/npu_format.py for when the RP9xx checks run."""

from __future__ import annotations

from raipack.checks.base import check
from raipack.core.package import ReadError
from raipack.npu import formats as fmt
from raipack.npu.constraints import NpuConstraints, placed_as_header_says, stored_in
from raipack.npu.reference import parsed_header, small_file

FUSED_DOMAIN = "ai.raipack"


def _graph_model(ctx):
    g = ctx.graph
    return None if g is None or isinstance(g, Exception) else g


@check("RP903", "fused-graph")
def fused_graph(ctx):
    """In a raipack package, `model.onnx` and `model.pb.bin` describe the same
    fused nodes: every node of domain `ai.raipack` has its local function and
    a header operator of the same type, every initializer stored in
    `model.bin` has the header's offset, length and shape, and every
    `MatMulNBits` inside a fused node meets the profile's NPU constraints
    (bits, `quantization.allowed_group_sizes`, K/N multiples)."""
    rel, doc = parsed_header(ctx)
    model = _graph_model(ctx)
    if doc is None or model is None:
        return
    # late: start-up time, protobuf loads only when a fused graph is checked
    from raipack.core import onnxproto as helper  # onnx's messages without onnx's import

    grel = ctx.graph_rel
    ops = {op.get("name"): op for op in doc.get("operators") or []}
    tensors = {t["name"]: t for _, _, _, t in fmt.header_tensors(doc)}
    functions = {f.name: f for f in model.functions if f.domain == FUSED_DOMAIN}
    limits = NpuConstraints.from_profile(ctx.profile)
    seen = set()
    for n in model.graph.node:
        if n.domain != FUSED_DOMAIN:
            continue
        seen.add(n.name)
        op = ops.get(n.name)
        if op is None:
            yield ctx.finding(grel, f"fused node {n.name} ({n.op_type}) has no operator in {rel}", "rebuild the package", n.name)
        elif op.get("op_type") != n.op_type:
            yield ctx.finding(grel, f"fused node {n.name} is {n.op_type} in the graph but {op.get('op_type')} in {rel}", "rebuild the package", n.name)
        fn = functions.get(n.op_type)
        if fn is None:
            yield ctx.finding(grel, f"fused node {n.name} uses {FUSED_DOMAIN}.{n.op_type}, but the model has no local function of that name", "rebuild the package; onnxruntime cannot run the node without its function", n.name)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        for inner in fn.node:
            if inner.op_type != "MatMulNBits":
                continue
            vals = {a.name: attrs.get(a.ref_attr_name) if a.ref_attr_name else helper.get_attribute_value(a) for a in inner.attribute}
            why = limits.matmul_problems(vals.get("bits", 4), vals.get("block_size"), vals.get("K"), vals.get("N"))
            if why:
                yield ctx.finding(grel, f"fused node {n.name}: its {inner.name} MatMulNBits breaks the NPU constraints of profile {ctx.profile.id}: " + ", ".join(why), "quantize with a group size the profile allows", n.name)
    for name in sorted(set(ops) - seen):
        yield ctx.finding(rel, f"lists operator {name}, which is not a node of {grel}", "rebuild the package", "/operators")
    wrel = doc.get("weights_file", "model.bin")
    for t, ext in stored_in(model.graph, wrel):
        entry = tensors.get(t.name)
        if entry is None:
            yield ctx.finding(grel, f"initializer {t.name} points into {wrel}, but {rel} does not list it", "rebuild the package", t.name)
        elif not placed_as_header_says(t, ext, entry):
            yield ctx.finding(grel, f"initializer {t.name} is at offset {ext.get('offset')} length {ext.get('length')} shape {list(t.dims)} in the graph but at {entry['offset']}, {entry['size']}, {entry.get('shape')} in {rel}", "rebuild the package; the graph and the header come from different builds", t.name)


@check("RP904", "fused-node-cache")
def fused_node_cache(ctx):
    """Every operator of a raipack `model.pb.bin` has its
    `cache/<node>_meta.json` and the `.const` descriptor it names; the
    descriptor parses, names the same node, records the header's sha256 and
    the same offsets and sizes for the node's tensors, as does the meta
    file's tensor map."""
    rel, doc = parsed_header(ctx)
    if doc is None:
        return
    header_sha = ctx._npu_header_sha
    for i, op in enumerate(doc.get("operators") or []):
        name = op.get("name")
        meta_rel = op.get("meta") or f"cache/{name}_meta.json"
        if meta_rel not in ctx.pkg.files:
            yield ctx.finding(meta_rel, f"is missing: fused node {name} has no cache meta file", "copy the whole cache folder, or rebuild the package", f"/operators/{i}/meta")
            continue
        meta = ctx.pkg.try_json(meta_rel)
        if not isinstance(meta, dict):
            continue  # RP201/RP202 report it
        tmap = meta.get("tensor_map") if isinstance(meta.get("tensor_map"), dict) else {}
        desc = tmap.get("descriptor") if isinstance(tmap.get("descriptor"), dict) else None
        folder = meta_rel.rsplit("/", 1)[0]
        if desc is None or not isinstance(desc.get("file_name"), str):
            yield ctx.finding(meta_rel, f"has no descriptor entry in its tensor_map (fused node {name})", "rebuild the package", "/tensor_map/descriptor")
            continue
        const_rel = f"{folder}/{desc['file_name']}"
        if const_rel not in ctx.pkg.files:
            continue  # RP603 reports the missing .const
        try:
            d = fmt.decode_const(small_file(ctx, const_rel), const_rel)
        except (fmt.FormatError, ValueError, ReadError) as err:
            yield ctx.finding(const_rel, str(err), "rebuild the package")
            continue
        if d.get("node") != name or d.get("op_type") != op.get("op_type"):
            yield ctx.finding(const_rel, f"describes {d.get('op_type')} {d.get('node')}, not {op.get('op_type')} {name}", "rebuild the package")
        if d.get("header_sha256") != header_sha:
            yield ctx.finding(const_rel, f"was written for another {rel} (its header_sha256 differs)", "rebuild the package; files of different builds were mixed")
        want = {t.get("role"): (t.get("offset"), t.get("size")) for t in op.get("tensors") or []}
        have = {t.get("role"): (t.get("offset"), t.get("size")) for t in d.get("tensors") or [] if isinstance(t, dict)}
        if have != want:
            yield ctx.finding(const_rel, f"lists tensors {sorted(have)} at other offsets or sizes than {rel} does for {name}", "rebuild the package")
        meta_t = {k: (v.get("offset"), v.get("size_in_bytes")) for k, v in tmap.items() if isinstance(v, dict) and "size_in_bytes" in v}
        if meta_t != want:
            yield ctx.finding(meta_rel, f"tensor_map places the tensors of {name} differently from {rel}", "rebuild the package", "/tensor_map")
