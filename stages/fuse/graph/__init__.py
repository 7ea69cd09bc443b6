"""The pattern rewrite: an onnxruntime-genai int4 decoder graph → raipack's fused graph.

Modules: `model` (op tables, FusedNode, the graph index), `patterns` (one layer's groups),
`constraints` (the NPU limits on MatMulNBits), `functions` (a group as an ONNX local function),
`cpu_side` (the static-shape edits, node order, what stays on the CPU), `rewrite` (`fuse_graph`),
`shapes` (static shapes and the execution schedule a plan records).

Each decoder layer of an OGA export is a fixed chain of nodes. `fuse_graph` finds, per layer, four
groups and replaces each with one node of the domain `ai.raipack`:

| fused op            | members in the OGA graph                                              |
|---------------------|-----------------------------------------------------------------------|
| `RMSNormQKV`        | `SimplifiedLayerNormalization` (layer 0) + the Q/K/V `MatMulNBits`     |
|                     | (+ the bias `Add` after each, when the model has q/k/v biases: Qwen2;  |
|                     | + the `Split` and per-head q/k RMS norms: Qwen3, Gemma 3)              |
| `SkipRMSNormQKV`    | `SkipSimplifiedLayerNormalization` (residual add + norm) + Q/K/V ones |
| `GQARope`           | `GroupQueryAttention` (rotary inside, `do_rotary=1`)                 |
| `OProjSkipRMSNorm`  | o_proj `MatMulNBits` + `SkipSimplifiedLayerNormalization`             |
| `SiluGatedMLP`      | gate/up `MatMulNBits`, `Sigmoid`, two `Mul`, down `MatMulNBits`        |
| `OProjSandwichRMSNorm` | Gemma 3: o_proj + post-attention norm + pre-feedforward skip norm  |
| `GeluGatedMLPRMSNorm`  | Gemma 3: gate/up, `Gelu` (tanh), `Mul`, down + post-feedforward norm |
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

from raipack.stages.fuse.graph.constraints import Constraints, check_matmul
from raipack.stages.fuse.graph.model import DOMAIN, FusedNode, FuseGraphResult, attr_value
from raipack.stages.fuse.graph.rewrite import fuse_graph
from raipack.stages.fuse.graph.shapes import ShapeError, static_schedule

__all__ = ["DOMAIN", "Constraints", "FuseGraphResult", "FusedNode", "ShapeError", "attr_value", "check_matmul", "fuse_graph", "static_schedule"]
