"""Gemma 3's decoder layer (onnxruntime-genai's Gemma3Model export) as four groups of member nodes.

A Gemma layer differs from the generic chain (patterns.py) in three places:
- per-head q/k RMS norms between the Q/K/V projection and the attention: the packed projection's
  output is split, and Q and K each pass Reshape → SimplifiedLayerNormalization → Reshape;
- sandwich norms: o_proj's output is normed (post-attention) before the residual add, and so is the
  MLP's (post-feedforward) before the next layer's add;
- a GeLU (tanh) gated MLP instead of SiLU.

| fused op                 | members                                                                                 |
|--------------------------|-----------------------------------------------------------------------------------------|
| `RMSNormQKV`, `SkipRMSNormQKV` (`...Split`) | the layer's input norm + the Q/K/V `MatMulNBits`, as in the generic chain |
| `QKNormGQARope`          | the `Split` of the packed projection (if packed), both q/k norms with their `Reshape`s, `GroupQueryAttention` |
| `OProjSandwichRMSNorm`   | o_proj `MatMulNBits` + post-attention `SimplifiedLayerNormalization` + pre-feedforward `SkipSimplifiedLayerNormalization` |
| `GeluGatedMLPRMSNorm`    | gate/up `MatMulNBits`, `Gelu` (tanh), `Mul`, down `MatMulNBits` + post-feedforward `SimplifiedLayerNormalization` |

Sliding and global layers are one pattern: they differ only in GroupQueryAttention's
`local_window_size` attribute and the cos/sin caches they read, which the fused node keeps.
`match_layer` returns None for a layer without the sandwich (not Gemma's), so the generic chain runs.
"""

from __future__ import annotations

from stages.fuse.graph.model import Graph

Group = tuple[str, list, list]
NORM, SKIP_NORM = "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"


def match_layer(g: Graph, gqa) -> tuple[list[Group], str] | None:
    """Gemma's groups of the layer of `gqa`, and why the walk stopped early ("" if it did not); None if the
    layer has no sandwich norm after o_proj (another family's)."""
    o_proj = _single(g, gqa.output[0], "MatMulNBits")
    post = _single(g, o_proj.output[0], NORM) if o_proj is not None else None
    if post is None:
        return None
    attn, projected, why = _attention_group(g, gqa)
    if attn is None:
        return [], why
    qkv, why = _qkv_group(g, projected)
    if qkv is None:
        return [attn], why
    groups = [qkv, attn]
    pre_ff = _single(g, post.output[0], SKIP_NORM)
    if pre_ff is None:
        return groups, "the post-attention norm does not feed a SkipSimplifiedLayerNormalization (pre-feedforward norm)"
    groups.append(("OProjSandwichRMSNorm", [o_proj, post, pre_ff], ["o_proj", "post_norm", "norm"]))
    mlp, why = _mlp_group(g, pre_ff)
    if mlp is None:
        return groups, why
    groups.append(mlp)
    return groups, ""


def _single(g: Graph, name: str, op_type: str):
    """The one consumer of `name`, if it is the only one and of `op_type`."""
    users = g.consumers.get(name, [])
    return users[0] if len(users) == 1 and users[0].op_type == op_type else None


def _qk_norm(g: Graph, name: str) -> tuple[list, str] | None:
    """Reshape → SimplifiedLayerNormalization → Reshape ending in `name`: (the three nodes, the tensor it normed)."""
    outer = g.prod(name, "Reshape")
    norm = g.prod(outer.input[0], NORM) if outer is not None else None
    inner = g.prod(norm.input[0], "Reshape") if norm is not None else None
    if inner is None:
        return None
    return [inner, norm, outer], inner.input[0]


def _attention_group(g: Graph, gqa) -> tuple[Group | None, list[str], str]:
    """(the attention group, the projection outputs it reads, why not)."""
    q, k, v = (list(gqa.input) + ["", "", ""])[:3]
    qn, kn = _qk_norm(g, q), _qk_norm(g, k)
    if qn is None or kn is None:
        return None, [], "the attention's query and key are not each RMS-normed per head (Reshape, SimplifiedLayerNormalization, Reshape)"
    members, labels = qn[0] + kn[0], ["q_reshape", "q_norm", "q_unshape", "k_reshape", "k_norm", "k_unshape"]
    split = g.prod(qn[1], "Split")
    if split is not None and list(split.output[:3]) == [qn[1], kn[1], v]:
        members, labels, projected = [split] + members, ["split"] + labels, [split.input[0]]
    else:
        projected = [qn[1], kn[1], v]
    return ("QKNormGQARope", members + [gqa], labels + ["attn"]), projected, ""


def _qkv_group(g: Graph, projected: list[str]) -> tuple[Group | None, str]:
    projs = [g.prod(x, "MatMulNBits") for x in projected]
    if any(p is None for p in projs):
        return None, "the attention input is not produced by MatMulNBits projections"
    if len({p.input[0] for p in projs}) != 1:
        return None, "the Q/K/V projections do not share one input"
    norm = g.prod(projs[0].input[0], (NORM, SKIP_NORM))
    if norm is None or norm.output[0] != projs[0].input[0]:
        return None, "the Q/K/V projections are not fed by an RMS norm"
    op_type = ("SkipRMSNormQKV" if norm.op_type == SKIP_NORM else "RMSNormQKV") + ("" if len(projs) == 1 else "Split")
    return (op_type, [norm] + projs, ["norm"] + (["qkv"] if len(projs) == 1 else ["q", "k", "v"])), ""


def _mlp_group(g: Graph, pre_ff) -> tuple[Group | None, str]:
    mm = g.only_consumers(pre_ff.output[0], "MatMulNBits")
    if len(mm) != 2 or len(g.consumers[pre_ff.output[0]]) != 2:
        return None, "the pre-feedforward norm does not feed exactly two MatMulNBits (gate, up)"
    acts = [(p, _single(g, p.output[0], "Gelu")) for p in mm]
    acts = [(p, a) for p, a in acts if a is not None]
    if len(acts) != 1:
        return None, "no GeLU after exactly one of the gate and up projections"
    gate, act = acts[0]
    up = mm[1] if mm[0] is gate else mm[0]
    mul = _single(g, act.output[0], "Mul")
    if mul is None or set(mul.input) != {act.output[0], up.output[0]} or len(g.consumers[up.output[0]]) != 1:
        return None, "the GeLU is not multiplied with the up projection"
    down = _single(g, mul.output[0], "MatMulNBits")
    if down is None:
        return None, "the gated product does not feed one MatMulNBits (down_proj)"
    post = _single(g, down.output[0], NORM)
    if post is None:
        return None, "down_proj does not feed a SimplifiedLayerNormalization (post-feedforward norm)"
    return ("GeluGatedMLPRMSNorm", [gate, up, act, mul, down, post], ["gate", "up", "act_gelu", "mul", "down", "post_norm"]), ""
