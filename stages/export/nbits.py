"""The model builder's int4 pass, skipped when it has nothing to quantize.

For an int4 export the builder's `save_model` calls `Model.to_nbits`, which copies the whole model into one
ModelProto (`ir.to_proto`: every initializer's bytes), runs onnxruntime's MatMulNBitsQuantizer over it and
converts back, with the builder's own model still alive. On a Quark input every linear is already a
MatMulNBits and Quark's exclusions (lm_head, the embedding) stay float and excluded, so the quantizer only
logs "skip" for each node, but the copy is about 7 GiB at Llama-3.1-8B: the export stage's 20.70 GiB peak
was reached there (docs/measurements/real_size.md, issue 25). The pass is skipped only when no node is
eligible and nothing else in it applies (per-node overrides, CUDA prepacking); the written files are the
same bytes (tests/test_stages/test_export.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def has_work(model: Any) -> bool:
    """Whether the builder's int4 pass would do anything on `model` (a builder Model after its graph is made):
    a node of an op type it quantizes, in the default domain, not excluded, with a constant weight; or a per-node
    override; or CUDA prepacking of MatMulNBits weights."""
    if getattr(model, "int4_customized_weight_config", None) or getattr(model, "exact_quant_override_names", None):
        return True
    if model.ep == "cuda" and model.matmul_attrs.get("weights_prepacked", 0):
        return True
    ops, excluded = set(model.quant_attrs["op_types_to_quantize"]), set(model.quant_attrs["nodes_to_exclude"])
    for node in model.model.graph.all_nodes():
        if node.op_type not in ops or node.domain not in ("", "ai.onnx") or node.name in excluded:
            continue
        i = 0 if node.op_type == "Gather" else 1
        if len(node.inputs) > i and node.inputs[i] is not None and node.inputs[i].const_value is not None:
            return True
    return False


@contextmanager
def skip_idle_nbits_pass() -> Iterator[list[bool]]:
    """While the block runs, the builder's `Model.to_nbits` returns its model unchanged when `has_work` says the
    pass would do nothing, and runs as the builder wrote it otherwise. Yields a list that records, per call,
    whether the pass was skipped; the builder's method is back afterwards."""
    from onnxruntime_genai.models import builder

    cls = builder.Model  # the class the builder's families derive from (it imports `builders` as a top-level package)
    original = cls.to_nbits
    skipped: list[bool] = []

    def to_nbits(self: Any) -> Any:
        if has_work(self):
            skipped.append(False)
            return original(self)
        skipped.append(True)
        return self.model

    cls.to_nbits = to_nbits
    try:
        yield skipped
    finally:
        cls.to_nbits = original
