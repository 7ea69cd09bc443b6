"""What the onnxruntime-genai 0.18 builder gets wrong for a family under transformers 5, fixed around it.

Gemma 3 (`Gemma3ForCausalLM`, model_type `gemma3_text`):
- transformers 5 folds `rope_theta`, `rope_scaling` and `rope_local_base_freq` into a nested
  `rope_parameters` ({"full_attention": {...}, "sliding_attention": {...}}); the builder reads the flat
  0.x form and fails on `rope_parameters["rope_type"]` (KeyError), or would take theta 10000 for the
  global layers. The config is put back in the flat form the builder reads (the global layers' rope
  as `rope_parameters`, the sliding layers' base as `rope_local_base_freq`).
- The builder makes the sliding layers' cos/sin cache with the global layers' rope scaling (Gemma-3-4b:
  linear, factor 8); transformers scales only the global layers. The local cache is made unscaled.
- The builder rounds the embedding scale sqrt(hidden_size) to two decimals; transformers does not.
- The builder gives sliding layers a window-sized KV cache of their own on the CPU EP by default; an NPU
  package has one static buffer of max_length positions per layer, so `windowed_kv_cache` is off and
  GroupQueryAttention's `local_window_size` alone keeps the window.

Mistral v0.1's sliding window: stages/export/mistral.py.

`patched_builder()` swaps the builder's classes for the fixed ones while `create_model` runs.
"""

from __future__ import annotations

import contextlib

from raipack.npu import families as family_table
from raipack.stages.export import mistral


def flat_rope(config) -> None:
    """Gemma 3's nested transformers-5 rope_parameters → the builder's flat fields, in place."""
    rope = getattr(config, "rope_parameters", None)
    if not isinstance(rope, dict) or "full_attention" not in rope:
        return
    full, local = dict(rope["full_attention"]), rope.get("sliding_attention") or rope["full_attention"]
    config.rope_theta = full["rope_theta"]
    config.rope_local_base_freq = local["rope_theta"]
    config.rope_parameters = full


def _gemma3_class():
    import numpy as np
    from onnxruntime_genai.models.builders.gemma import Gemma3Model

    class Gemma3(Gemma3Model):
        def __init__(self, config, io_dtype, onnx_dtype, ep, cache_dir, extra_options):
            flat_rope(config)
            super().__init__(config, io_dtype, onnx_dtype, ep, cache_dir, extra_options)
            self.embed_attrs["scale"] = float(np.sqrt(self.hidden_size))

        def make_rotary_embedding_multi_cache(self):
            self.cos_cache_global_name, self.sin_cache_global_name = "cos_cache_global", "sin_cache_global"
            super(Gemma3Model, self).make_rotary_embedding_caches(cos_cache_name=self.cos_cache_global_name, sin_cache_name=self.sin_cache_global_name)
            self.rope_attrs.update(create_caches=True, theta=self.rope_local_theta, rescale_factors=1)
            self.rope_attrs.pop("rescale_inv_freq", None)
            self.cos_cache_local_name, self.sin_cache_local_name = "cos_cache_local", "sin_cache_local"
            super(Gemma3Model, self).make_rotary_embedding_caches(cos_cache_name=self.cos_cache_local_name, sin_cache_name=self.sin_cache_local_name)

    return "Gemma3Model", Gemma3


def extra_options(model_type: str | None) -> dict[str, str]:
    """The builder's extra options of the family (`export_options` of its families-table entry; the caller's own win)."""
    return family_table.export_options(model_type)


@contextlib.contextmanager
def patched_builder():
    """The builder module with the fixed family classes in place of its own, restored afterwards."""
    from onnxruntime_genai.models import builder

    fixed = dict([_gemma3_class(), mistral.mistral_class()])
    saved = {name: getattr(builder, name) for name in fixed}
    for name, cls in fixed.items():
        setattr(builder, name, cls)
    try:
        yield
    finally:
        for name, cls in saved.items():
            setattr(builder, name, cls)
