"""What the rewrite works on: the op tables, a fused node, the result, and an index of the graph."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

import onnx
from onnx import AttributeProto, helper

from raipack.core.findings import Finding

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
        (const arguments by role; a gated MLP, SiLU or GeLU-tanh, is one FlatMLP)."""
        role_of = {name: role for role, name in self.weights}
        ops = []
        for node, label in zip(self.members, self.labels):
            if node.op_type in ("Sigmoid", "Mul", "Gelu", "FastGelu"):  # the MLP's activation: FlatMLP's attribute
                continue
            ops.append({"name": f"{self.name}/{label}", "type": NPU_OP.get(node.op_type, node.op_type),
                        "in_args": [i for i in node.input if i and i not in role_of],
                        "const_args": [role_of[i] for i in node.input if i in role_of],
                        "out_args": [o for o in node.output if o],
                        "attrs": {a.name: attr_value(a) for a in node.attribute}})
        if self.op_type.startswith(("SiluGatedMLP", "GeluGatedMLP")):
            (gate, up, down), rest = ops[:3], ops[3:]  # rest: Gemma's post-feedforward norm
            activation = "silu" if self.op_type.startswith("Silu") else "gelu_tanh"
            ops = [{"name": f"{self.name}/mlp", "type": "FlatMLP", "in_args": gate["in_args"],
                    "const_args": gate["const_args"] + up["const_args"] + down["const_args"], "out_args": down["out_args"],
                    "attrs": {"activation": activation, "gate": gate["attrs"], "up": up["attrs"], "down": down["attrs"]}}, *rest]
        return ops


@dataclass
class FuseGraphResult:
    model: onnx.ModelProto  # the fused graph; initializers keep their TensorProto (with data) for the writer
    fused: list[FusedNode]
    npu_initializers: list[str]  # names, in model.bin order
    cpu_initializers: list[str]
    cpu_nodes: list[dict]  # nodes left on the CPU: {name, op_type, why}
    findings: list[Finding]
    io: dict


def attr_value(a: AttributeProto):
    """An attribute's value as plain JSON data (bytes decoded)."""
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list):
        return [x.decode() if isinstance(x, bytes) else x for x in v]
    return v


def attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def finding(severity: str, pointer: str, message: str, hint: str = "", check_id: str = "fuse") -> Finding:
    """A finding about a node of the fused graph (`pointer` names it)."""
    return Finding(check_id, severity, "model.onnx", message, hint, pointer)


class Graph:
    """Producers and consumers of every tensor of a graph."""

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
