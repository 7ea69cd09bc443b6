"""Gemma 3's decoder layer (onnxruntime-genai's Gemma3Model export) as four groups of member nodes.

A Gemma layer's Q/K/V group and attention are the generic chain's (patterns.py: the norm, the packed
projection, its Split and the per-head q/k norms, as Qwen3's; then `GQARope`). It differs after them:
- sandwich norms: o_proj's output is normed (post-attention) before the residual add, and so is the
  MLP's (post-feedforward) before the next layer's add;
- a GeLU (tanh) gated MLP instead of SiLU.

| fused op                 | members                                                                                 |
|--------------------------|-----------------------------------------------------------------------------------------|
| `RMSNormQKV`, `SkipRMSNormQKV` | the generic chain's: input norm, Q/K/V `MatMulNBits`, `Split`, q/k norms with their `Reshape`s |
| `GQARope`                | `GroupQueryAttention`, as in the generic chain                                          |
| `OProjSandwichRMSNorm`   | o_proj `MatMulNBits` + post-attention `SimplifiedLayerNormalization` + pre-feedforward `SkipSimplifiedLayerNormalization` |
| `GeluGatedMLPRMSNorm`    | gate/up `MatMulNBits`, `Gelu` (tanh), `Mul`, down `MatMulNBits` + post-feedforward `SimplifiedLayerNormalization` |

Sliding and global layers are one pattern: they differ only in GroupQueryAttention's
`local_window_size` attribute and the cos/sin caches they read, which the fused node keeps.
`match_layer` returns None for a layer without the sandwich (not Gemma's), so the generic chain runs.
"""

from __future__ import annotations

from raipack.stages.fuse.graph.model import Graph, attr
from raipack.stages.fuse.graph.patterns import qkv_group

Group = tuple[str, list, list]
NORM, SKIP_NORM = "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"


def match_layer(g: Graph, gqa) -> tuple[list[Group], str] | None:
    """Gemma's groups of the layer of `gqa`, and why the walk stopped early ("" if it did not); None if the
    layer has no sandwich norm after o_proj (another family's)."""
    o_proj = _single(g, gqa.output[0], "MatMulNBits")
    post = _single(g, o_proj.output[0], NORM) if o_proj is not None else None
    if post is None:
        return None
    qkv, why = qkv_group(g, gqa)
    if qkv is None:
        return [], why
    groups = [qkv, ("GQARope" if attr(gqa, "do_rotary", 0) else "GQA", [gqa], ["attn"])]
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
