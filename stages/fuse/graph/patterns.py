"""The fixed chain of one decoder layer of an OGA export, as four groups of member nodes.

`match_layer` starts at a layer's GroupQueryAttention and walks to its neighbours: the RMS norm and
Q/K/V projections before it (`RMSNormQKV`, `SkipRMSNormQKV`, `...Split`), the attention itself
(`GQARope`), o_proj with the post-attention norm (`OProjSkipRMSNorm`) and the SiLU gated MLP
(`SiluGatedMLP`). A group is (op_type, members, labels); the walk stops at the first link that is not
the expected one and says why.
"""

from __future__ import annotations

import importlib

from raipack.npu import families
from raipack.stages.fuse.graph.model import Graph, attr

Group = tuple[str, list, list]


def match_layer(g: Graph, gqa) -> tuple[list[Group], str]:
    """The groups of one layer as (op_type, members, labels), and why the walk stopped early ("" if it did not).
    The first of `family_matchers()` that recognises the layer decides; else the generic chain below."""
    for matcher in family_matchers():
        found = matcher(g, gqa)
        if found is not None:
            return found
    return match_chain(g, gqa)


def family_matchers() -> tuple:
    """The extension point for a family whose layer chain differs from the generic one (a module of
    its own in this package, e.g. gemma.py): matchers tried in order before `match_chain`, each
    `fn(g, gqa)` returning (groups, why) for a layer of its family and None for any other layer.
    Which modules: `fuse_matcher` of the families table (pipeline/data/architectures.json). Imported
    here rather than at the top so a family module may import this module's group helpers."""
    return tuple(importlib.import_module(f"raipack.stages.fuse.graph.{name}").match_layer for name in families.fuse_matchers())


def match_chain(g: Graph, gqa) -> tuple[list[Group], str]:
    """The generic chain: norm + Q/K/V, attention, o_proj + norm, SiLU gated MLP."""
    qkv, why = qkv_group(g, gqa)
    if qkv is None:
        return [], why
    groups = [qkv, ("GQARope" if attr(gqa, "do_rotary", 0) else "GQA", [gqa], ["attn"])]
    o_proj, why = _o_proj_group(g, gqa)
    if o_proj is None:
        return groups, why
    groups.append(o_proj)
    mlp, why = _mlp_group(g, o_proj[1][1])
    if mlp is None:
        return groups, why
    groups.append(mlp)
    return groups, ""


def _projection(g: Graph, name: str) -> tuple:
    """(MatMulNBits, bias Add or None) producing `name`: the projection, or its output plus a bias
    initializer (Qwen2's q/k/v biases, written by the builder as an Add after the MatMulNBits)."""
    add = g.prod(name, "Add")
    if add is None:
        return g.prod(name, "MatMulNBits"), None
    for x, b in (add.input[:2], add.input[1::-1]):
        mm = g.prod(x, "MatMulNBits")
        if mm is not None and b in g.inits and len(g.consumers[x]) == 1:
            return mm, add
    return None, None


def _head_norm(g: Graph, name: str) -> tuple[str, list]:
    """(the tensor a per-head RMS norm reads, its three nodes) when `name` is the output of one: Qwen3's
    q/k norms, written by the builder as Reshape to heads, SimplifiedLayerNormalization, Reshape back;
    (`name`, []) when it is not."""
    back = g.prod(name, "Reshape")
    norm = g.prod(back.input[0], "SimplifiedLayerNormalization") if back is not None else None
    to_heads = g.prod(norm.input[0], "Reshape") if norm is not None else None
    if to_heads is None or any(len(g.consumers[n.output[0]]) != 1 for n in (to_heads, norm)):
        return name, []
    return to_heads.input[0], [to_heads, norm, back]


def _packed_split(g: Graph, sources: list[str]):
    """The Split node whose three outputs are `sources` (the builder splits a packed Q/K/V projection
    when per-head q/k norms follow it), else None."""
    split = g.prod(sources[0], "Split") if len(sources) == 3 else None
    return split if split is not None and list(split.output[:3]) == sources else None


def qkv_group(g: Graph, gqa) -> tuple[Group | None, str]:
    """The norm and Q/K/V projections feeding the attention, with the optional members between them
    and the attention: bias Adds (Qwen2), a Split of the packed projection and per-head q/k norms (Qwen3)."""
    q, k, v = (list(gqa.input) + ["", "", ""])[:3]
    names, plabels = ([q], ["qkv"]) if k == "" and v == "" else ([q, k, v], ["q", "k", "v"])
    after, alabels = [], []  # members after the projections, in graph order
    sources = []
    for name, label in zip(names, plabels):
        src, chain = _head_norm(g, name)
        sources.append(src)
        after += chain
        alabels += [f"{label}_norm_in", f"{label}_norm", f"{label}_norm_out"] if chain else []
    split = _packed_split(g, sources)
    if split is not None:
        sources, plabels = [split.input[0]], ["qkv"]
        after, alabels = [split] + after, ["split"] + alabels
    found = [_projection(g, x) for x in sources]
    projs = [p for p, _ in found]
    if any(p is None for p in projs):
        return None, "the attention input is not produced by MatMulNBits projections (with or without a bias Add)"
    biases = [(add, f"{label}_bias") for (_, add), label in zip(found, plabels) if add is not None]
    if len({p.input[0] for p in projs}) != 1:
        return None, "the Q/K/V projections do not share one input"
    norm = g.prod(projs[0].input[0], ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"))
    if norm is None or norm.output[0] != projs[0].input[0]:
        return None, "the Q/K/V projections are not fed by an RMS norm"
    skip = norm.op_type == "SkipSimplifiedLayerNormalization"
    qkv_type = ("SkipRMSNormQKV" if skip else "RMSNormQKV") + ("" if len(projs) == 1 else "Split")
    members = [norm] + projs + [a for a, _ in biases] + after
    labels = ["norm"] + plabels + [label for _, label in biases] + alabels
    return (qkv_type, members, labels), ""


def _o_proj_group(g: Graph, gqa) -> tuple[Group | None, str]:
    o_proj = g.only_consumers(gqa.output[0], "MatMulNBits")
    if len(o_proj) != 1 or len(g.consumers[gqa.output[0]]) != 1:
        return None, "the attention output does not feed one MatMulNBits (o_proj)"
    post = g.only_consumers(o_proj[0].output[0], "SkipSimplifiedLayerNormalization")
    if len(post) != 1:
        return None, "o_proj does not feed a SkipSimplifiedLayerNormalization"
    return ("OProjSkipRMSNorm", [o_proj[0], post[0]], ["o_proj", "norm"]), ""


def _mlp_group(g: Graph, post) -> tuple[Group | None, str]:
    mm = g.only_consumers(post.output[0], "MatMulNBits")
    if len(mm) != 2 or len(g.consumers[post.output[0]]) != 2:
        return None, "the post-attention norm does not feed exactly two MatMulNBits (gate, up)"
    gate = sig = None
    for cand in mm:
        sigs = g.only_consumers(cand.output[0], "Sigmoid")
        if len(sigs) == 1:
            gate, sig = cand, sigs[0]
    if gate is None:
        return None, "no SiLU (Sigmoid + Mul) after the gate projection"
    up = mm[1] if mm[0] is gate else mm[0]
    acts = [n for n in g.only_consumers(sig.output[0], "Mul") if set(n.input) == {gate.output[0], sig.output[0]}]
    if len(acts) != 1:
        return None, "the gate activation is not x * sigmoid(x)"
    act = acts[0]
    muls = [n for n in g.only_consumers(act.output[0], "Mul") if set(n.input) == {act.output[0], up.output[0]}]
    if len(muls) != 1:
        return None, "the activation is not multiplied with the up projection"
    mul = muls[0]
    down = g.only_consumers(mul.output[0], "MatMulNBits")
    if len(down) != 1 or len(g.consumers[mul.output[0]]) != 1:
        return None, "the gated product does not feed one MatMulNBits (down_proj)"
    return ("SiluGatedMLP", [gate, up, sig, act, mul, down[0]], ["gate", "up", "act_sigmoid", "act_mul", "mul", "down"]), ""
