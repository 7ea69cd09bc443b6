"""`fuse_graph`: find each layer's groups, turn each into one node of domain ai.raipack backed by a
local function, apply the CPU-side edits and split the initializers between model.bin and
model.onnx.data. The module docstring of the package says what changes and why."""

from __future__ import annotations

from collections import defaultdict

import onnx
from onnx import AttributeProto, helper

from raipack.stages.fuse.graph.constraints import Constraints, check_matmul
from raipack.stages.fuse.graph.cpu_side import cpu_nodes, prune, static_shape_edits, toposort
from raipack.stages.fuse.graph.functions import group_io, make_function, signature
from raipack.stages.fuse.graph.model import DOMAIN, DOMAIN_VERSION, LAYER_RE, MS, SLOTS, FusedNode, FuseGraphResult, Graph, finding
from raipack.stages.fuse.graph.patterns import match_layer


def io_names(genai: dict) -> dict:
    """The decoder's input and output names from genai_config.json (the builder's defaults where absent)."""
    dec = genai["model"]["decoder"]
    ins, outs = dec.get("inputs", {}), dec.get("outputs", {})
    layers = range(int(dec["num_hidden_layers"]))
    return {
        "input_ids": ins.get("input_ids", "input_ids"),
        "attention_mask": ins.get("attention_mask", "attention_mask"),
        "logits": outs.get("logits", "logits"),
        "past": [(ins.get("past_key_names", "past_key_values.%d.key") % i, ins.get("past_value_names", "past_key_values.%d.value") % i) for i in layers],
        "present": [(outs.get("present_key_names", "present.%d.key") % i, outs.get("present_value_names", "present.%d.value") % i) for i in layers],
    }


class _Fuser:
    """Collects fused nodes and their functions (one function per distinct group signature)."""

    def __init__(self, g: Graph, constraints: Constraints, opsets: list):
        self.g, self.constraints, self.opsets = g, constraints, opsets
        self.fused: list[FusedNode] = []
        self.functions: list[onnx.FunctionProto] = []
        self.findings: list = []
        self.taken: set[int] = set()
        self.rejected: set[int] = set()  # nodes of groups refused for NPU constraints (reported once per group)
        self._variants: dict[str, list] = defaultdict(list)

    def add_group(self, op_type: str, members: list, labels: list, layer: int | None) -> None:
        bad = [f"{n.name}: {why}" for n in members if n.op_type == "MatMulNBits" for why in check_matmul(n, self.constraints)]
        if bad:
            self.findings.append(finding("error", members[0].name, f"{op_type} of layer {layer} cannot go to the NPU: " + "; ".join(bad) + "; its nodes stay on the CPU",
                                         "quantize with a group size and shapes the profile allows (quantization.allowed_group_sizes)", "fuse-npu-constraint"))
            self.rejected.update(id(n) for n in members)
            return
        acts, weights, outs = group_io(self.g, members, self.g.outputs)
        fname = self._function(op_type, members, labels, acts, weights, outs)
        attrs = {f"{label}_{a.name}": a for n, label in zip(members, labels) for a in n.attribute}
        name = f"{op_type}_{layer}" if layer is not None else f"{op_type}_{len(self.fused)}"
        self.fused.append(FusedNode(name, fname, layer, members, labels, acts + weights, outs, _roles(members, labels, weights), attrs, fname))
        self.taken.update(id(n) for n in members)

    def _function(self, op_type, members, labels, acts, weights, outs) -> str:
        sig = signature(members, labels, acts, weights, outs)
        variants = self._variants[op_type]
        new = sig not in variants
        if new:
            variants.append(sig)
        k = variants.index(sig)
        fname = op_type if k == 0 else f"{op_type}_v{k + 1}"
        if new:
            self.functions.append(make_function(fname, members, labels, (acts, weights, outs), self.opsets))
        return fname

    def add_layers(self, gqas: list) -> None:
        for idx, gqa in enumerate(gqas):
            m = LAYER_RE.search(gqa.name)
            layer = int(m.group(1)) if m else idx
            groups, why = match_layer(self.g, gqa)
            for op_type, members, labels in groups:
                if not any(id(n) in self.taken for n in members):
                    self.add_group(op_type, members, labels, layer)
            if why:
                self.findings.append(finding("error", gqa.name, f"layer {layer}: {why}; the rest of the layer stays on the CPU",
                                             "this export's layer pattern is not one the reference backend fuses", "fuse-pattern"))
        # any other MatMulNBits (a quantized lm_head) becomes a single-op fused node
        for n in self.g.nodes:
            if n.op_type == "MatMulNBits" and id(n) not in self.taken and not check_matmul(n, self.constraints):
                self.add_group("QMatMul", [n], ["lm_head" if "lm_head" in n.name else "matmul"], None)

    def nodes(self) -> list:
        """The graph's node list with each group replaced by its fused node (at its first member's place)."""
        first_member = {id(f.members[0]): f for f in self.fused}
        member_ids = {id(n) for f in self.fused for n in f.members}
        nodes = []
        for n in self.g.nodes:
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
        return nodes


def _roles(members: list, labels: list, weights: list) -> list[tuple[str, str]]:
    """(role, initializer) for each weight: the first member reading it, and its input slot."""
    roles = []
    for w in weights:
        for n, label in zip(members, labels):
            if w in n.input:
                slot = SLOTS.get(n.op_type, [])
                j = list(n.input).index(w)
                roles.append((f"{label}.{slot[j] if j < len(slot) else f'in{j}'}", w))
                break
    return roles


def _check_inputs(g: Graph, graph_inputs: set[str], io: dict) -> list:
    if io["attention_mask"] not in graph_inputs:
        raise ValueError(f"the graph has no {io['attention_mask']!r} input; the reference runtime needs the attention mask")
    if "position_ids" in graph_inputs:
        raise ValueError("the graph takes position_ids: only exports with rotary inside GroupQueryAttention (do_rotary=1) are supported")
    gqas = [n for n in g.nodes if n.op_type == "GroupQueryAttention"]
    if not gqas:
        raise ValueError("the graph has no GroupQueryAttention node: not an onnxruntime-genai decoder export")
    return gqas


def _split_initializers(model: onnx.ModelProto, nodes: list, fused: list[FusedNode]) -> tuple[list[str], list[str]]:
    """(NPU initializers in fused-node order, CPU initializers): a weight goes to model.bin when only fused nodes read it."""
    used = {i for n in nodes for i in n.input if i}
    fused_names = {f.name for f in fused}
    consumers_of = defaultdict(set)
    for n in nodes:
        for i in n.input:
            consumers_of[i].add(n.name if n.domain == DOMAIN and n.name in fused_names else "")
    npu = []
    for f in fused:
        for _, w in f.weights:
            if w not in npu and consumers_of[w] <= fused_names:
                npu.append(w)
    cpu = [t.name for t in model.graph.initializer if t.name in used and t.name not in npu]
    return npu, cpu


def _output_model(model: onnx.ModelProto, nodes: list, keep: set[str], functions: list, logits: str) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    del out.graph.initializer[:]
    out.graph.initializer.extend(t for t in model.graph.initializer if t.name in keep)
    del out.graph.value_info[:]
    for o in out.graph.output:
        if o.name == logits:
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
    return out


def fuse_graph(model: onnx.ModelProto, genai: dict, constraints: Constraints) -> FuseGraphResult:
    """Rewrite `model` (loaded without external data) for the reference package. Pure: the input is
    not modified. See the package docstring for what changes."""
    original, model = model, onnx.ModelProto()
    model.CopyFrom(original)  # the graph holds no weight bytes: a cheap copy keeps the caller's model intact
    io = io_names(genai)
    g = Graph(model.graph)
    graph_inputs = {i.name for i in model.graph.input}
    gqas = _check_inputs(g, graph_inputs, io)
    opsets = [helper.make_opsetid(o.domain, o.version) for o in model.opset_import if o.domain in ("", "ai.onnx", MS)]
    fuser = _Fuser(g, constraints, opsets)
    fuser.add_layers(gqas)

    nodes, lm_node, hidden = static_shape_edits(fuser.nodes(), fuser.fused, gqas, io)
    nodes = toposort(nodes, graph_inputs | set(g.inits))
    nodes = prune(nodes, {o.name for o in model.graph.output})
    npu, cpu = _split_initializers(model, nodes, fuser.fused)
    findings = fuser.findings
    on_cpu = cpu_nodes(nodes, lm_node, hidden, fuser.rejected, findings)
    out = _output_model(model, nodes, set(npu) | set(cpu), fuser.functions, io["logits"])
    return FuseGraphResult(out, fuser.fused, npu, cpu, on_cpu, findings, io)
