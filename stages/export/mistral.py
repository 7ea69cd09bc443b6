"""Mistral v0.1's sliding window, which the onnxruntime-genai 0.18 builder drops.

The builder gives a layer GroupQueryAttention's `local_window_size` = `sliding_window` only when
`layer_types` marks it `sliding_attention`; Mistral's config has `sliding_window` (v0.1: 4096) and no
`layer_types`, so every layer was exported with `local_window_size` -1: full attention, where
transformers' mask lets a token see the last `sliding_window` keys, itself included (GQA counts the
same way). Every layer of such a config is marked sliding here. v0.2/v0.3 (`sliding_window` null) are
left as they are.

The builder would then also give the sliding layers a window-sized KV cache of their own (CPU EP
default); an NPU package has one static buffer of max_length positions per layer, so
`windowed_kv_cache` is off (`export_options` of mistral in pipeline/data/architectures.json) and `local_window_size` alone keeps the window, as for Gemma 3.

A float export (precision fp32, a transformers model as the builder's input) takes every
`nn.Linear` whose width is the vocabulary for lm_head; the first one found wins, so a model whose
MLP is as wide as its vocabulary (the tiny v0.1 stand-in: 512 and 512) got layer 0's gate_proj after
its post-attention norm as lm_head. The head is the model's output embedding here. The export stage is
not concerned (a Quark export's modules are the builder's own, and its lm_head is found by name).
"""

from __future__ import annotations


def all_sliding(config) -> None:
    """`layer_types` of a windowed config without one: every layer sliding, in place."""
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "layer_types", None) is None:
        config.layer_types = ["sliding_attention"] * config.num_hidden_layers


def mistral_class():
    """(name in the builder module, the fixed class) for `raipack.stages.export.families.patched_builder`."""
    from onnxruntime_genai.models.builders.mistral import MistralModel

    class Mistral(MistralModel):
        def __init__(self, config, io_dtype, onnx_dtype, ep, cache_dir, extra_options):
            all_sliding(config)
            super().__init__(config, io_dtype, onnx_dtype, ep, cache_dir, extra_options)

        def has_lm_head(self, module):
            head = getattr(self.weights, "get_output_embeddings", None)
            return module is head() if callable(head) else super().has_lm_head(module)

    return "MistralModel", Mistral
