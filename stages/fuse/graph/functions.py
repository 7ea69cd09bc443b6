"""A group of member nodes as an ONNX local function: its inputs and outputs, the signature that
lets groups share one function, and the FunctionProto whose body is the members themselves (every
attribute an attribute reference, so onnxruntime runs the same kernels with the same attributes)."""

from __future__ import annotations

import onnx
from onnx import AttributeProto, helper

from raipack.stages.fuse.graph.model import DOMAIN, Graph


def group_io(g: Graph, members: list, graph_outputs: set[str]) -> tuple[list[str], list[str], list[str]]:
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


def signature(members, labels, acts, weights, outs) -> tuple:
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


def _local(formal: dict, name: str) -> str:
    """The function-local name of graph tensor `name` ("" stays "")."""
    if not name:
        return ""
    if name not in formal:
        formal[name] = f"t{len(formal)}"
    return formal[name]


def make_function(name: str, members, labels, io: tuple[list, list, list], opsets) -> onnx.FunctionProto:
    """The function of a group of nodes; `io` is the group's (activations, weights, outputs) (graph.group_io)."""
    acts, weights, outs = io
    formal = {x: f"x{j}" for j, x in enumerate(acts)}
    formal.update({x: f"w{j}" for j, x in enumerate(weights)})
    formal.update({o: f"y{j}" for j, o in enumerate(outs)})
    in_names = [formal[x] for x in acts + weights]
    out_names = [formal[o] for o in outs]
    nodes, attr_names = [], []
    for n, label in zip(members, labels):
        ins = [_local(formal, i) for i in n.input]
        outs_local = [_local(formal, o) for o in n.output]
        node = helper.make_node(n.op_type, ins, outs_local, name=f"{label}", domain=n.domain)
        for a in n.attribute:
            ref = f"{label}_{a.name}"
            node.attribute.append(AttributeProto(name=a.name, ref_attr_name=ref, type=a.type))
            attr_names.append(ref)
        nodes.append(node)
    return helper.make_function(DOMAIN, name, in_names, out_names, nodes, opsets, attributes=attr_names)
