"""The pattern rewrite: an onnxruntime-genai int4 decoder graph → raipack's fused graph.

Each decoder layer of an OGA export is a fixed chain of nodes. `fuse_graph` finds, per layer, four
groups and replaces each with one node of the domain `ai.raipack`:

| fused op            | members in the OGA graph                                              |
|---------------------|-----------------------------------------------------------------------|
| `RMSNormQKV`        | `SimplifiedLayerNormalization` (layer 0) + the Q/K/V `MatMulNBits`     |
| `SkipRMSNormQKV`    | `SkipSimplifiedLayerNormalization` (residual add + norm) + Q/K/V ones |
| `GQARope`           | `GroupQueryAttention` (rotary inside, `do_rotary=1`)                 |
| `OProjSkipRMSNorm`  | o_proj `MatMulNBits` + `SkipSimplifiedLayerNormalization`             |
| `SiluGatedMLP`      | gate/up `MatMulNBits`, `Sigmoid`, two `Mul`, down `MatMulNBits`        |
| `QMatMul`           | any other `MatMulNBits` (a quantized lm_head)                          |

(`...Split` variants take separate Q, K and V projections.) Each fused op type is also an ONNX
local function (FunctionProto) whose body is the very member nodes, with every attribute turned into
an attribute reference: onnxruntime inlines it and runs the same kernels with the same attributes,
so the fused graph computes what the OGA graph computes. The weights of fused nodes leave
`model.onnx.data` for `model.bin` (the caller writes them; this module only decides).

Two CPU-side edits make the graph suit a static-shape runtime (see docs/formats.md):
- `seqlens_k` for GroupQueryAttention becomes `total_sequence_length - 1` (the attention mask's
  length) instead of `sum(attention_mask) - 1`, so padding on the right of a prompt chunk is run as
  ordinary positions that the causal mask hides from every real token;
- the lm_head runs on one row only, the last real token: index `sum(mask) - past - 1`, where past
  is `mask length - sequence length`. `logits` is therefore `[batch, 1, vocab]`.

A group whose `MatMulNBits` break an NPU constraint of the profile (bits, group size, K/N multiples)
is not fused; it stays in the graph as it was, and a finding says so. Nodes that are neither fused
nor on the known CPU side (embedding, mask arithmetic, LongRoPE's cache choice, final norm, lm_head)
are reported too.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

import onnx
from onnx import AttributeProto, TensorProto, helper

DOMAIN = "ai.raipack"
DOMAIN_VERSION = 1
MS = "com.microsoft"

# Input slot names of the member ops, for the tensor roles of the header.
SLOTS = {
    "MatMulNBits": ["A", "B", "scales", "zero_points", "g_idx", "bias"],
    "SimplifiedLayerNormalization": ["X", "scale"],
    "SkipSimplifiedLayerNormalization": ["input", "skip", "gamma", "bias"],
    "GroupQueryAttention": ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
                            "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink"],
}
# The AMD-style NPU op names written in cache/<node>_meta.json op_list.
NPU_OP = {"MatMulNBits": "MladfMatMul", "SimplifiedLayerNormalization": "FlatRMSNorm",
          "SkipSimplifiedLayerNormalization": "FlatRMSAdd", "GroupQueryAttention": "FLATMHA"}
CPU_SIDE_OPS = {"Constant", "Shape", "Gather", "Cast", "Sub", "Add", "ReduceSum", "Transpose", "Unsqueeze",
                "Squeeze", "Reshape", "Concat", "Slice", "Identity", "GatherBlockQuantized", "Mul", "Div"}
LAYER_RE = re.compile(r"/layers\.(\d+)/")


@dataclass
class Constraints:
    bits: int = 4
    group_sizes: tuple[int, ...] = (128,)
    k_multiple: int = 1
    n_multiple: int = 1

    @classmethod
    def from_profile(cls, profile: dict) -> "Constraints":
        q = profile.get("quantization") or {}
        groups = q.get("allowed_group_sizes") or [q.get("group_size", 128)]
        return cls(bits=int(q.get("bits", 4)), group_sizes=tuple(int(g) for g in groups),
                   k_multiple=int(q.get("npu_k_multiple", 1)), n_multiple=int(q.get("npu_n_multiple", 1)))


@dataclass
class FusedNode:
    name: str
    op_type: str
    layer: int | None
    members: list  # the original NodeProtos, in graph order
    labels: list[str]  # one label per member (norm, qkv, attn, o_proj, gate, ...)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    weights: list[tuple[str, str]] = field(default_factory=list)  # (role, initializer name)
    attrs: dict = field(default_factory=dict)  # reference name → value
    function: str = ""

    def npu_ops(self) -> list[dict]:
        """The node's parts in AMD's op vocabulary, each with its own in/const/out arguments
        (const arguments by role; the SiLU gated MLP is one FlatMLP)."""
        role_of = {name: role for role, name in self.weights}
        ops = []
        for node, label in zip(self.members, self.labels):
            if node.op_type in ("Sigmoid", "Mul"):
                continue
            ops.append({"name": f"{self.name}/{label}", "type": NPU_OP.get(node.op_type, node.op_type),
                        "in_args": [i for i in node.input if i and i not in role_of],
                        "const_args": [role_of[i] for i in node.input if i in role_of],
                        "out_args": [o for o in node.output if o],
                        "attrs": {a.name: _attr_value(a) for a in node.attribute}})
        if self.op_type.startswith("SiluGatedMLP"):
            gate, up, down = ops
            ops = [{"name": f"{self.name}/mlp", "type": "FlatMLP", "in_args": gate["in_args"],
                    "const_args": gate["const_args"] + up["const_args"] + down["const_args"], "out_args": down["out_args"],
                    "attrs": {"activation": "silu", "gate": gate["attrs"], "up": up["attrs"], "down": down["attrs"]}}]
        return ops


@dataclass
class FuseGraphResult:
    model: onnx.ModelProto  # the fused graph; initializers keep their TensorProto (with data) for the writer
    fused: list[FusedNode]
    npu_initializers: list[str]  # names, in model.bin order
    cpu_initializers: list[str]
    cpu_nodes: list[dict]  # nodes left on the CPU: {name, op_type, why}
    findings: list[dict]
    io: dict


def _attr_value(a: AttributeProto):
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list):
        return [x.decode() if isinstance(x, bytes) else x for x in v]
    return v


def finding(severity: str, pointer: str, message: str, hint: str = "", check_id: str = "fuse") -> dict:
    return {"check_id": check_id, "severity": severity, "path": "model.onnx", "pointer": pointer, "message": message, "hint": hint}


class _Graph:
    def __init__(self, graph: onnx.GraphProto):
        self.nodes = list(graph.node)
        self.inits = {t.name: t for t in graph.initializer}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list] = defaultdict(list)
        for n in self.nodes:
            for o in n.output:
                if o:
                    self.producer[o] = n
            for i in n.input:
                if i:
                    self.consumers[i].append(n)
        self.outputs = {o.name for o in graph.output}

    def prod(self, name: str, op_type: str | tuple) -> onnx.NodeProto | None:
        n = self.producer.get(name)
        types = (op_type,) if isinstance(op_type, str) else op_type
        return n if n is not None and n.op_type in types else None

    def only_consumers(self, name: str, op_type: str) -> list:
        return [n for n in self.consumers.get(name, []) if n.op_type == op_type]


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def check_matmul(node, c: Constraints) -> list[str]:
    """Why a MatMulNBits node cannot run on the NPU under constraints `c` (empty: it can)."""
    why = []
    bits, block, K, N = _attr(node, "bits", 4), _attr(node, "block_size"), _attr(node, "K"), _attr(node, "N")
    if bits != c.bits:
        why.append(f"bits is {bits}, the NPU kernels take {c.bits}")
    if block not in c.group_sizes:
        why.append(f"block_size (group size) is {block}, the profile allows {list(c.group_sizes)}")
    if K is None or N is None:
        why.append("K or N attribute missing")
    else:
        if K % c.k_multiple or (block and K % block):
            why.append(f"K={K} is not a multiple of {c.k_multiple if K % c.k_multiple else block}")
        if N % c.n_multiple:
            why.append(f"N={N} is not a multiple of {c.n_multiple}")
    if len(node.input) > 4 and any(node.input[4:]):
        why.append("g_idx or bias inputs are not supported by the fused kernels")
    return why


def _match_layer(g: _Graph, gqa) -> tuple[list[tuple[str, list, list]], str]:
    """The four groups of one layer as (op_type, members, labels), or ([], reason)."""
    groups = []
    q, k, v = (list(gqa.input) + ["", "", ""])[:3]
    if k == "" and v == "":
        projs = [g.prod(q, "MatMulNBits")]
        plabels = ["qkv"]
    else:
        projs = [g.prod(x, "MatMulNBits") for x in (q, k, v)]
        plabels = ["q", "k", "v"]
    if any(p is None for p in projs):
        return [], "the attention input is not produced by MatMulNBits projections"
    if len({p.input[0] for p in projs}) != 1:
        return [], "the Q/K/V projections do not share one input"
    norm = g.prod(projs[0].input[0], ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"))
    if norm is None or norm.output[0] != projs[0].input[0]:
        return [], "the Q/K/V projections are not fed by an RMS norm"
    skip = norm.op_type == "SkipSimplifiedLayerNormalization"
    qkv_type = ("SkipRMSNormQKV" if skip else "RMSNormQKV") + ("" if len(projs) == 1 else "Split")
    groups.append((qkv_type, [norm] + projs, ["norm"] + plabels))
    groups.append(("GQARope" if _attr(gqa, "do_rotary", 0) else "GQA", [gqa], ["attn"]))

    o_proj = g.only_consumers(gqa.output[0], "MatMulNBits")
    if len(o_proj) != 1 or len(g.consumers[gqa.output[0]]) != 1:
        return groups, "the attention output does not feed one MatMulNBits (o_proj)"
    o_proj = o_proj[0]
    post = g.only_consumers(o_proj.output[0], "SkipSimplifiedLayerNormalization")
    if len(post) != 1:
        return groups, "o_proj does not feed a SkipSimplifiedLayerNormalization"
    post = post[0]
    groups.append(("OProjSkipRMSNorm", [o_proj, post], ["o_proj", "norm"]))

    mm = g.only_consumers(post.output[0], "MatMulNBits")
    if len(mm) != 2 or len(g.consumers[post.output[0]]) != 2:
        return groups, "the post-attention norm does not feed exactly two MatMulNBits (gate, up)"
    gate = up = sig = act = None
    for cand in mm:
        sigs = g.only_consumers(cand.output[0], "Sigmoid")
        if len(sigs) == 1:
            gate, sig = cand, sigs[0]
    if gate is None:
        return groups, "no SiLU (Sigmoid + Mul) after the gate projection"
    up = mm[1] if mm[0] is gate else mm[0]
    acts = [n for n in g.only_consumers(sig.output[0], "Mul") if set(n.input) == {gate.output[0], sig.output[0]}]
    if len(acts) != 1:
        return groups, "the gate activation is not x * sigmoid(x)"
    act = acts[0]
    muls = [n for n in g.only_consumers(act.output[0], "Mul") if set(n.input) == {act.output[0], up.output[0]}]
    if len(muls) != 1:
        return groups, "the activation is not multiplied with the up projection"
    mul = muls[0]
    down = g.only_consumers(mul.output[0], "MatMulNBits")
    if len(down) != 1 or len(g.consumers[mul.output[0]]) != 1:
        return groups, "the gated product does not feed one MatMulNBits (down_proj)"
    groups.append(("SiluGatedMLP", [gate, up, sig, act, mul, down[0]], ["gate", "up", "act_sigmoid", "act_mul", "mul", "down"]))
    return groups, ""


def _group_io(g: _Graph, members: list, graph_outputs: set[str]) -> tuple[list[str], list[str], list[str]]:
    """(activation inputs, initializer inputs, outputs used outside the group), in first-use order."""
    produced = {o for n in members for o in n.output if o}
    ids = {id(n) for n in members}
    acts, weights = [], []
    for n in members:
        for i in n.input:
            if not i or i in produced:
                continue
            target = weights if i in g.inits else acts
            if i not in target:
                target.append(i)
    outs = []
    for n in members:
        for o in n.output:
            if o and (o in graph_outputs or any(id(c) not in ids for c in g.consumers.get(o, []))):
                outs.append(o)
    return acts, weights, outs


def _signature(members, labels, acts, weights, outs) -> tuple:
    """What makes two groups share one function: op types, wiring and attribute names."""
    local = {}
    for j, x in enumerate(acts + weights):
        local[x] = f"i{j}"
    sig = []
    for n, label in zip(members, labels):
        for o in n.output:
            if o and o not in local:
                local[o] = f"t{len(local)}"
        sig.append((n.op_type, n.domain, label, tuple(local.get(i, "") for i in n.input),
                    tuple(local.get(o, "") for o in n.output), tuple(sorted(a.name for a in n.attribute))))
    sig.append(tuple(local[o] for o in outs))
    return tuple(sig)


def _make_function(name: str, members, labels, acts, weights, outs, opsets) -> onnx.FunctionProto:
    formal = {}
    in_names = []
    for j, x in enumerate(acts):
        formal[x] = f"x{j}"
        in_names.append(f"x{j}")
    for j, x in enumerate(weights):
        formal[x] = f"w{j}"
        in_names.append(f"w{j}")
    out_names = []
    for j, o in enumerate(outs):
        formal[o] = f"y{j}"
        out_names.append(f"y{j}")
    nodes, attr_names = [], []
    for k, (n, label) in enumerate(zip(members, labels)):
        ins = []
        for i in n.input:
            if not i:
                ins.append("")
            elif i not in formal:
                formal[i] = f"t{len(formal)}"
                ins.append(formal[i])
            else:
                ins.append(formal[i])
        outs_local = []
        for o in n.output:
            if not o:
                outs_local.append("")
                continue
            if o not in formal:
                formal[o] = f"t{len(formal)}"
            outs_local.append(formal[o])
        node = helper.make_node(n.op_type, ins, outs_local, name=f"{label}", domain=n.domain)
        for a in n.attribute:
            ref = f"{label}_{a.name}"
            node.attribute.append(AttributeProto(name=a.name, ref_attr_name=ref, type=a.type))
            attr_names.append(ref)
        nodes.append(node)
    return helper.make_function(DOMAIN, name, in_names, out_names, nodes, opsets, attributes=attr_names)


def fuse_graph(model: onnx.ModelProto, genai: dict, constraints: Constraints) -> FuseGraphResult:
    """Rewrite `model` (loaded without external data) for the reference package. Pure: the input is
    not modified. See the module docstring for what changes."""
    original, model = model, onnx.ModelProto()
    model.CopyFrom(original)  # the graph holds no weight bytes: a cheap copy keeps the caller's model intact
    dec = genai["model"]["decoder"]
    ins, outs = dec.get("inputs", {}), dec.get("outputs", {})
    io = {
        "input_ids": ins.get("input_ids", "input_ids"),
        "attention_mask": ins.get("attention_mask", "attention_mask"),
        "logits": outs.get("logits", "logits"),
        "past": [(ins.get("past_key_names", "past_key_values.%d.key") % i, ins.get("past_value_names", "past_key_values.%d.value") % i) for i in range(int(dec["num_hidden_layers"]))],
        "present": [(outs.get("present_key_names", "present.%d.key") % i, outs.get("present_value_names", "present.%d.value") % i) for i in range(int(dec["num_hidden_layers"]))],
    }
    g = _Graph(model.graph)
    graph_inputs = {i.name for i in model.graph.input}
    findings: list[dict] = []
    if io["attention_mask"] not in graph_inputs:
        raise ValueError(f"the graph has no {io['attention_mask']!r} input; the reference runtime needs the attention mask")
    if "position_ids" in graph_inputs:
        raise ValueError("the graph takes position_ids: only exports with rotary inside GroupQueryAttention (do_rotary=1) are supported")

    gqas = [n for n in g.nodes if n.op_type == "GroupQueryAttention"]
    if not gqas:
        raise ValueError("the graph has no GroupQueryAttention node: not an onnxruntime-genai decoder export")
    fused: list[FusedNode] = []
    seen_sig: dict[str, list] = defaultdict(list)
    opsets = [helper.make_opsetid(o.domain, o.version) for o in model.opset_import if o.domain in ("", "ai.onnx", MS)]
    functions: list[onnx.FunctionProto] = []
    taken: set[int] = set()
    rejected: set[int] = set()  # nodes of groups refused for NPU constraints (reported once per group)
    graph_outputs = set(g.outputs)

    def add_group(op_type, members, labels, layer):
        bad = []
        for n in members:
            if n.op_type == "MatMulNBits":
                for why in check_matmul(n, constraints):
                    bad.append(f"{n.name}: {why}")
        if bad:
            findings.append(finding("error", members[0].name, f"{op_type} of layer {layer} cannot go to the NPU: " + "; ".join(bad) + "; its nodes stay on the CPU",
                                    "quantize with a group size and shapes the profile allows (quantization.allowed_group_sizes)", "fuse-npu-constraint"))
            rejected.update(id(n) for n in members)
            return
        acts, weights, outs_ = _group_io(g, members, graph_outputs)
        sig = _signature(members, labels, acts, weights, outs_)
        variants = seen_sig[op_type]
        if sig in variants:
            fname = op_type if variants.index(sig) == 0 else f"{op_type}_v{variants.index(sig) + 1}"
        else:
            variants.append(sig)
            fname = op_type if len(variants) == 1 else f"{op_type}_v{len(variants)}"
            functions.append(_make_function(fname, members, labels, acts, weights, outs_, opsets))
        attrs = {}
        for n, label in zip(members, labels):
            for a in n.attribute:
                attrs[f"{label}_{a.name}"] = a
        roles = []
        for w in weights:
            for n, label in zip(members, labels):
                if w in n.input:
                    slot = SLOTS.get(n.op_type, [])
                    j = list(n.input).index(w)
                    roles.append((f"{label}.{slot[j] if j < len(slot) else f'in{j}'}", w))
                    break
        name = f"{op_type}_{layer}" if layer is not None else f"{op_type}_{len(fused)}"
        fused.append(FusedNode(name, fname, layer, members, labels, acts + weights, outs_, roles, attrs, fname))
        taken.update(id(n) for n in members)

    for idx, gqa in enumerate(gqas):
        m = LAYER_RE.search(gqa.name)
        layer = int(m.group(1)) if m else idx
        groups, why = _match_layer(g, gqa)
        for op_type, members, labels in groups:
            if any(id(n) in taken for n in members):
                continue
            add_group(op_type, members, labels, layer)
        if why:
            findings.append(finding("error", gqa.name, f"layer {layer}: {why}; the rest of the layer stays on the CPU",
                                    "this export's layer pattern is not one the reference backend fuses", "fuse-pattern"))
    # any other MatMulNBits (a quantized lm_head) becomes a single-op fused node
    for n in g.nodes:
        if n.op_type == "MatMulNBits" and id(n) not in taken and not check_matmul(n, constraints):
            label = "lm_head" if "lm_head" in n.name else "matmul"
            add_group("QMatMul", [n], [label], None)

    # -- rebuild the node list -------------------------------------------------------------------
    first_member = {id(f.members[0]): f for f in fused}
    member_ids = {id(n) for f in fused for n in f.members}
    nodes = []
    for n in g.nodes:
        if id(n) in first_member:
            f = first_member[id(n)]
            node = helper.make_node(f.function, f.inputs, f.outputs, name=f.name, domain=DOMAIN)
            for ref, a in f.attrs.items():
                b = AttributeProto()
                b.CopyFrom(a)
                b.name = ref
                node.attribute.append(b)
            nodes.append(node)
        elif id(n) not in member_ids:
            nodes.append(n)

    # -- CPU-side edits: seqlens_k from the mask length; lm_head on the last real row ------------
    mask, ids_name = io["attention_mask"], io["input_ids"]
    extra = [
        helper.make_node("Constant", [], ["/raipack/const/one"], name="/raipack/const/one", value=helper.make_tensor("one", TensorProto.INT64, [1], [1])),
        helper.make_node("Constant", [], ["/raipack/const/axis1"], name="/raipack/const/axis1", value=helper.make_tensor("axis1", TensorProto.INT64, [], [1])),
        helper.make_node("Shape", [mask], ["/raipack/mask/shape"], name="/raipack/mask/Shape"),
        helper.make_node("Gather", ["/raipack/mask/shape", "/raipack/const/axis1"], ["/raipack/mask/total"], name="/raipack/mask/Total", axis=0),
        helper.make_node("Sub", ["/raipack/mask/total", "/raipack/const/one"], ["/raipack/mask/total_minus_one"], name="/raipack/mask/TotalMinusOne"),
        helper.make_node("Cast", ["/raipack/mask/total_minus_one"], ["/raipack/mask/seqlens_k"], name="/raipack/mask/SeqlensK", to=TensorProto.INT32),
        helper.make_node("ReduceSum", [mask, "/raipack/const/one"], ["/raipack/mask/real"], name="/raipack/mask/Real", keepdims=0),
        helper.make_node("Shape", [ids_name], ["/raipack/ids/shape"], name="/raipack/ids/Shape"),
        helper.make_node("Gather", ["/raipack/ids/shape", "/raipack/const/axis1"], ["/raipack/ids/seq"], name="/raipack/ids/Seq", axis=0),
        helper.make_node("Sub", ["/raipack/mask/total", "/raipack/ids/seq"], ["/raipack/mask/past"], name="/raipack/mask/Past"),
        helper.make_node("Sub", ["/raipack/mask/real", "/raipack/mask/past"], ["/raipack/mask/real_in_chunk"], name="/raipack/mask/RealInChunk"),
        helper.make_node("Sub", ["/raipack/mask/real_in_chunk", "/raipack/const/one"], ["/raipack/logits/index"], name="/raipack/logits/Index"),
    ]
    seqlens_names = {gq.input[5] for gq in gqas if len(gq.input) > 5 and gq.input[5]}
    for n in nodes:
        for j, i in enumerate(n.input):
            if i in seqlens_names:
                n.input[j] = "/raipack/mask/seqlens_k"
    for f in fused:
        f.inputs = ["/raipack/mask/seqlens_k" if i in seqlens_names else i for i in f.inputs]
    lm_head = g.producer.get(io["logits"])
    if lm_head is None:
        raise ValueError(f"no node produces {io['logits']!r}")
    lm_node = next((n for n in nodes if io["logits"] in n.output), None)
    hidden = lm_node.input[0]
    extra.append(helper.make_node("Gather", [hidden, "/raipack/logits/index"], ["/raipack/logits/last_hidden"], name="/raipack/logits/LastRow", axis=1))
    lm_node.input[0] = "/raipack/logits/last_hidden"
    for f in fused:
        if f.name == lm_node.name:
            f.inputs = [("/raipack/logits/last_hidden" if i == hidden else i) for i in f.inputs]
    nodes = extra + nodes

    # -- drop what nothing uses any more, sort -----------------------------------------------------
    nodes = _toposort(nodes, graph_inputs | set(g.inits))
    nodes = _prune(nodes, {o.name for o in model.graph.output})
    used = {i for n in nodes for i in n.input if i}
    npu, cpu = [], []
    fused_names = {f.name for f in fused}
    consumers_of = defaultdict(set)
    for n in nodes:
        for i in n.input:
            consumers_of[i].add(n.name if n.domain == DOMAIN and n.name in fused_names else "")
    for f in fused:
        for _, w in f.weights:
            if w not in npu and consumers_of[w] <= fused_names:
                npu.append(w)
    for t in model.graph.initializer:
        if t.name in used and t.name not in npu:
            cpu.append(t.name)

    cpu_nodes = []
    for n in nodes:
        if n.domain == DOMAIN:
            continue
        heavy = n.op_type in ("MatMulNBits", "GroupQueryAttention", "MatMul", "Gemm")
        if n.name == lm_node.name:
            why = "lm_head in float (kept on the CPU, as Quark excluded it)" if n.op_type == "MatMul" else "lm_head"
        elif n.op_type in ("SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization") and n.output[0] == hidden:
            why = "final norm"
        elif n.name.startswith("/raipack/"):
            why = "mask and logits-row arithmetic"
        elif n.name.startswith("/model/rope_caches_subgraph/") and n.op_type in ("Greater", "If"):
            why = "rotary cache choice (LongRoPE short or long factors by total length)"
        elif heavy or LAYER_RE.search(n.name) or n.op_type not in CPU_SIDE_OPS:
            why = "not fused"
            if id(n) not in rejected:
                findings.append(finding("error" if heavy else "warning", n.name, f"{n.op_type} node {n.name} is not part of a fused operator and runs on the CPU",
                                        "see the findings about its layer", "fuse-cpu-fallback"))
        else:
            why = "embedding or mask arithmetic"
        cpu_nodes.append({"name": n.name, "op_type": n.op_type, "why": why})

    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    keep = set(npu) | set(cpu)
    inits = [t for t in model.graph.initializer if t.name in keep]
    del out.graph.initializer[:]
    out.graph.initializer.extend(inits)
    del out.graph.value_info[:]
    for o in out.graph.output:
        if o.name == io["logits"]:
            dims = o.type.tensor_type.shape.dim
            if len(dims) == 3:
                dims[1].Clear()
                dims[1].dim_value = 1
    del out.functions[:]
    out.functions.extend(functions)
    if not any(o.domain == DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    out.producer_name = "raipack"
    out.producer_version = "fuse-reference-1"
    return FuseGraphResult(out, fused, npu, cpu, cpu_nodes, findings, io)


def _prune(nodes: list, outputs: set[str]) -> list:
    need = set(outputs)
    keep = []
    for n in reversed(nodes):
        if any(o in need for o in n.output if o):
            keep.append(n)
            need.update(i for i in n.input if i)
    return list(reversed(keep))


def _toposort(nodes: list, available: set[str]) -> list:
    avail = set(available)
    pending = list(nodes)
    out = []
    while pending:
        rest = []
        for n in pending:
            if all((not i) or i in avail for i in n.input):
                out.append(n)
                avail.update(o for o in n.output if o)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            missing = sorted({i for n in rest for i in n.input if i and i not in avail})[:5]
            raise ValueError(f"the fused graph has a cycle or undefined inputs: {missing}")
        pending = rest
    return out


# ----------------------------------------------------------------------------- static shapes

class ShapeError(ValueError):
    pass


def _dtype_name(code: int) -> str:
    from pipeline.npu.formats import ONNX_DTYPE

    if code not in ONNX_DTYPE:
        raise ShapeError(f"unsupported tensor data type {code}")
    return ONNX_DTYPE[code]


def _broadcast(*shapes):
    rank = max(len(s) for s in shapes)
    out = []
    for dims in zip(*[[1] * (rank - len(s)) + list(s) for s in shapes]):
        big = [d for d in dims if d != 1]
        if len(set(big)) > 1:
            raise ShapeError(f"shapes {shapes} do not broadcast")
        out.append(big[0] if big else 1)
    return out


def _infer(node, info: dict, values: dict, attrs: dict, functions: dict, scratch: list):
    """Sets info[output] = (dtype, shape) (and values[output] for small int tensors) for one node."""
    import numpy as np

    def a(name, default=None):
        return attrs.get(name, default)

    ins = [info.get(i) if i else None for i in node.input]
    vals = [values.get(i) if i else None for i in node.input]
    op = node.op_type
    outs = list(node.output)

    def put(k, dtype, shape, value=None):
        if k < len(outs) and outs[k]:
            info[outs[k]] = (dtype, [int(d) for d in shape])
            if value is not None:
                values[outs[k]] = value

    if node.domain == DOMAIN:
        fn = functions[node.op_type]
        local_info, local_vals = {}, {}
        for formal, actual in zip(fn.input, node.input):
            if actual:
                local_info[formal] = info[actual]
                if actual in values:
                    local_vals[formal] = values[actual]
        for inner in fn.node:
            inner_attrs = {}
            for at in inner.attribute:
                src = attrs[at.ref_attr_name] if at.ref_attr_name else helper.get_attribute_value(at)
                inner_attrs[at.name] = src
            _infer(inner, local_info, local_vals, inner_attrs, functions, scratch)
        for formal, actual in zip(fn.output, node.output):
            if actual:
                info[actual] = local_info[formal]
        return
    if op == "Constant":
        t = a("value")
        from onnx import numpy_helper

        arr = numpy_helper.to_array(t)
        put(0, _dtype_name(t.data_type), arr.shape, arr if arr.size <= 16 else None)
    elif op == "Shape":
        shape = ins[0][1]
        put(0, "int64", [len(shape)], np.array(shape, np.int64))
    elif op == "Gather":
        axis = a("axis", 0)
        d, i = ins[0][1], ins[1][1]
        axis = axis % len(d)
        value = None
        if vals[0] is not None and vals[1] is not None:
            value = np.take(vals[0], vals[1], axis=axis)
        put(0, ins[0][0], d[:axis] + i + d[axis + 1:], value)
    elif op == "Reshape":
        if vals[1] is None:
            raise ShapeError(f"{node.name}: Reshape to a shape that is not a constant")
        src = ins[0][1]
        shape = [int(x) for x in np.atleast_1d(vals[1])]
        shape = [src[k] if x == 0 and not a("allowzero", 0) else x for k, x in enumerate(shape)]
        if -1 in shape:
            known = int(np.prod([x for x in shape if x != -1]))
            shape[shape.index(-1)] = int(np.prod(src)) // max(known, 1)
        put(0, ins[0][0], shape, None if vals[0] is None else vals[0].reshape(shape))
    elif op in ("Unsqueeze", "Squeeze"):
        src = list(ins[0][1])
        axes = [int(x) for x in np.atleast_1d(vals[1])] if len(ins) > 1 and vals[1] is not None else list(a("axes", []) or [])
        if op == "Unsqueeze":
            rank = len(src) + len(axes)
            for ax in sorted(x % rank for x in axes):
                src.insert(ax, 1)
            shape = src
        else:
            axes = [x % len(src) for x in axes] or [k for k, d in enumerate(src) if d == 1]
            shape = [d for k, d in enumerate(src) if k not in axes]
        put(0, ins[0][0], shape, None if vals[0] is None else vals[0].reshape(shape))
    elif op == "Concat":
        axis = a("axis") % len(ins[0][1])
        shape = list(ins[0][1])
        shape[axis] = sum(x[1][axis] for x in ins if x is not None)
        value = np.concatenate(vals, axis=axis) if all(v is not None for v in vals) else None
        put(0, ins[0][0], shape, value)
    elif op == "GatherBlockQuantized":
        d, i = ins[0][1], ins[1][1]
        gaxis = a("gather_axis", 0) % len(d)
        qaxis = a("quantize_axis", len(d) - 1) % len(d)
        shape = list(d)
        if ins[0][0] == "uint8":
            shape[qaxis] *= 8 // a("bits", 4)
        put(0, ins[2][0], shape[:gaxis] + i + shape[gaxis + 1:])
    elif op == "Cast":
        to = _dtype_name(a("to"))
        put(0, to, ins[0][1], None if vals[0] is None else vals[0].astype(to))
    elif op in ("Add", "Sub", "Mul", "Div"):
        value = None
        if vals[0] is not None and vals[1] is not None:
            value = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.floor_divide}[op](vals[0], vals[1])
        put(0, ins[0][0], _broadcast(ins[0][1], ins[1][1]), value)
    elif op in ("Sigmoid", "Identity", "Relu", "Tanh", "Neg", "Erf", "Softmax"):
        put(0, ins[0][0], ins[0][1], vals[0])
    elif op == "ReduceSum":
        shape = ins[0][1]
        if len(ins) > 1 and ins[1] is not None:
            if vals[1] is None:
                raise ShapeError(f"{node.name}: ReduceSum axes are not a constant")
            axes = [int(x) % len(shape) for x in np.atleast_1d(vals[1])]
        else:
            axes = list(range(len(shape)))
        keep = a("keepdims", 1)
        out = [1 if k in axes else d for k, d in enumerate(shape)] if keep else [d for k, d in enumerate(shape) if k not in axes]
        put(0, ins[0][0], out)
    elif op == "Transpose":
        shape = ins[0][1]
        perm = a("perm") or list(reversed(range(len(shape))))
        put(0, ins[0][0], [shape[p] for p in perm])
    elif op == "MatMul":
        x, w = ins[0][1], ins[1][1]
        if x[-1] != w[-2]:
            raise ShapeError(f"{node.name}: MatMul {x} × {w}")
        put(0, ins[0][0], _broadcast(x[:-2], w[:-2]) + [x[-2], w[-1]])
    elif op == "MatMulNBits":
        x = ins[0][1]
        if x[-1] != a("K"):
            raise ShapeError(f"{node.name}: input last dimension {x[-1]} is not K={a('K')}")
        put(0, ins[0][0], x[:-1] + [a("N")])
    elif op == "SimplifiedLayerNormalization":
        x = ins[0]
        put(0, x[0], x[1])
        put(1, "float32", x[1][:-1] + [1])
    elif op == "SkipSimplifiedLayerNormalization":
        x = ins[0]
        put(0, x[0], x[1])
        put(1, "float32", x[1][:-1] + [1])
        put(2, "float32", x[1][:-1] + [1])
        put(3, x[0], x[1])
    elif op == "GroupQueryAttention":
        q, past = ins[0][1], ins[3][1]
        heads, kvh = a("num_heads"), a("kv_num_heads")
        hs = past[3]
        B, S = q[0], q[1]
        put(0, ins[0][0], [B, S, heads * hs])
        put(1, ins[3][0], past)
        put(2, ins[4][0], ins[4][1])
        scratch.append((node.name, B * heads * S * past[2] * 4))
    elif op in ("Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual"):
        value = None
        if vals[0] is not None and vals[1] is not None:
            value = getattr(np, {"Greater": "greater", "Less": "less", "Equal": "equal", "GreaterOrEqual": "greater_equal", "LessOrEqual": "less_equal"}[op])(vals[0], vals[1])
        put(0, "bool", _broadcast(ins[0][1], ins[1][1]), value)
    elif op == "If":  # e.g. LongRoPE's choice of short or long rotary caches by total length
        branches = [a("then_branch"), a("else_branch")]
        if vals[0] is not None:  # the plan's length decides the branch
            branches = [branches[0] if bool(np.asarray(vals[0]).reshape(-1)[0]) else branches[1]]
        results = []
        for g in branches:
            local_info, local_vals = dict(info), dict(values)
            for inner in g.node:
                inner_attrs = {at.name: helper.get_attribute_value(at) for at in inner.attribute}
                _infer(inner, local_info, local_vals, inner_attrs, functions, scratch)
            results.append([(local_info[o.name], local_vals.get(o.name)) for o in g.output])
        for k, outs_k in enumerate(zip(*results)):
            dtypes = {o[0][0] for o in outs_k}
            if len(dtypes) > 1:
                raise ShapeError(f"{node.name}: the branches of If give output {k} different types {sorted(dtypes)}")
            shape = [max(dims) for dims in zip(*[o[0][1] for o in outs_k])]  # an upper bound when both can run
            put(k, outs_k[0][0][0], shape, outs_k[0][1] if len(outs_k) == 1 else None)
    else:
        raise ShapeError(f"{node.name}: no static shape rule for {node.domain or 'ai.onnx'}.{op}")


def static_schedule(model: onnx.ModelProto, feeds: dict[str, tuple[str, list[int]]]):
    """Run shape inference at fixed input shapes. Returns (steps, info) where steps is a list of
    {node, op_type, device, inputs, outputs, scratch} in execution order and info maps every tensor
    (inputs, initializers, activations) to (dtype, shape)."""
    info = dict(feeds)
    for t in model.graph.initializer:
        info[t.name] = (_dtype_name(t.data_type), list(t.dims))
    values: dict = {}
    functions = {f.name: f for f in model.functions}
    steps = []
    for n in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        scratch: list = []
        _infer(n, info, values, attrs, functions, scratch)
        steps.append({"node": n.name, "op_type": n.op_type, "device": "npu" if n.domain == DOMAIN else "cpu",
                      "inputs": [i for i in n.input if i], "outputs": [o for o in n.output if o],
                      "scratch": sum(b for _, b in scratch)})
    return steps, info
