"""The CPU side of the fused graph: the two edits for a static-shape runtime, the order and pruning
of the node list, and why each node left on the CPU is there."""

from __future__ import annotations

from onnx import TensorProto, helper

from raipack.stages.fuse.graph.model import CPU_SIDE_OPS, DOMAIN, LAYER_RE, finding

SEQLENS = "/raipack/mask/seqlens_k"
LAST_HIDDEN = "/raipack/logits/last_hidden"


def mask_nodes(mask: str, ids_name: str) -> list:
    """seqlens_k = mask length - 1, and the logits row index = sum(mask) - past - 1 (past = mask length - sequence length)."""
    return [
        helper.make_node("Constant", [], ["/raipack/const/one"], name="/raipack/const/one", value=helper.make_tensor("one", TensorProto.INT64, [1], [1])),
        helper.make_node("Constant", [], ["/raipack/const/axis1"], name="/raipack/const/axis1", value=helper.make_tensor("axis1", TensorProto.INT64, [], [1])),
        helper.make_node("Shape", [mask], ["/raipack/mask/shape"], name="/raipack/mask/Shape"),
        helper.make_node("Gather", ["/raipack/mask/shape", "/raipack/const/axis1"], ["/raipack/mask/total"], name="/raipack/mask/Total", axis=0),
        helper.make_node("Sub", ["/raipack/mask/total", "/raipack/const/one"], ["/raipack/mask/total_minus_one"], name="/raipack/mask/TotalMinusOne"),
        helper.make_node("Cast", ["/raipack/mask/total_minus_one"], [SEQLENS], name="/raipack/mask/SeqlensK", to=TensorProto.INT32),
        helper.make_node("ReduceSum", [mask, "/raipack/const/one"], ["/raipack/mask/real"], name="/raipack/mask/Real", keepdims=0),
        helper.make_node("Shape", [ids_name], ["/raipack/ids/shape"], name="/raipack/ids/Shape"),
        helper.make_node("Gather", ["/raipack/ids/shape", "/raipack/const/axis1"], ["/raipack/ids/seq"], name="/raipack/ids/Seq", axis=0),
        helper.make_node("Sub", ["/raipack/mask/total", "/raipack/ids/seq"], ["/raipack/mask/past"], name="/raipack/mask/Past"),
        helper.make_node("Sub", ["/raipack/mask/real", "/raipack/mask/past"], ["/raipack/mask/real_in_chunk"], name="/raipack/mask/RealInChunk"),
        helper.make_node("Sub", ["/raipack/mask/real_in_chunk", "/raipack/const/one"], ["/raipack/logits/index"], name="/raipack/logits/Index"),
    ]


def static_shape_edits(nodes: list, fused: list, gqas: list, io: dict) -> tuple[list, object, str]:
    """Feeds every GroupQueryAttention seqlens_k from the mask length and runs the lm_head on the last
    real row only. Returns (nodes with the new ones first, the lm_head node, the hidden state it read)."""
    seqlens_names = {gq.input[5] for gq in gqas if len(gq.input) > 5 and gq.input[5]}
    for n in nodes:
        for j, i in enumerate(n.input):
            if i in seqlens_names:
                n.input[j] = SEQLENS
    for f in fused:
        f.inputs = [SEQLENS if i in seqlens_names else i for i in f.inputs]
    lm_node = next((n for n in nodes if io["logits"] in n.output), None)
    if lm_node is None:
        raise ValueError(f"no node produces {io['logits']!r}")
    hidden = lm_node.input[0]
    extra = mask_nodes(io["attention_mask"], io["input_ids"])
    extra.append(helper.make_node("Gather", [hidden, "/raipack/logits/index"], [LAST_HIDDEN], name="/raipack/logits/LastRow", axis=1))
    lm_node.input[0] = LAST_HIDDEN
    for f in fused:
        if f.name == lm_node.name:
            f.inputs = [(LAST_HIDDEN if i == hidden else i) for i in f.inputs]
    return extra + nodes, lm_node, hidden


def cpu_nodes(nodes: list, lm_node, hidden: str, rejected: set[int], findings: list) -> list[dict]:
    """{name, op_type, why} for every node not fused; a node that should have been fused is also a finding."""
    out = []
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
        out.append({"name": n.name, "op_type": n.op_type, "why": why})
    return out


def prune(nodes: list, outputs: set[str]) -> list:
    need = set(outputs)
    keep = []
    for n in reversed(nodes):
        if any(o in need for o in n.output if o):
            keep.append(n)
            need.update(i for i in n.input if i)
    return list(reversed(keep))


def toposort(nodes: list, available: set[str]) -> list:
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
