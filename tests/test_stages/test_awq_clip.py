"""Quark's AWQ clipping search, a few rows at a time (stages/quantize/awq_clip.py): the same bounds as Quark's
unpatched function, bit for bit, with a temporary bounded by chunk_bytes."""

from __future__ import annotations

import pytest

from raipack.stages.quantize import awq_clip

LIMITS = {"sample_tokens": 512, "out_channel_batch": 256, "out_channel_batch_fallback": 64, "chunk_bytes": 256 << 20}


def test_sampled_tokens_follow_quarks_stride():
    assert awq_clip.sampled_tokens(1024, 512) == 512  # every 2nd
    assert awq_clip.sampled_tokens(1500, 512) == 750  # stride 1500 // 512 = 2
    assert awq_clip.sampled_tokens(900, 512) == 900  # stride 1
    assert awq_clip.sampled_tokens(96, 512) == 96
    assert awq_clip.sampled_tokens(0, 512) == 0


def test_rows_per_call_bound_the_product_and_never_exceed_quarks_batch():
    # Llama-3.1-8B down_proj in bfloat16: 512 x 14336 x 2 bytes a row, 18 rows in 256 MiB (Quark: 256 rows, 3.5 GiB)
    assert awq_clip.rows_per_call(4096, 14336, 512, 2, LIMITS) == 18
    assert awq_clip.rows_per_call(14336, 4096, 512, 2, LIMITS) == 64  # gate/up: 4 MiB a row
    small = awq_clip.rows_per_call(1536, 576, 96, 4, LIMITS)  # the example model's calibration fits Quark's own batch
    assert small == 256
    assert awq_clip.rows_per_call(576, 1536, 96, 4, LIMITS) == 64  # out not a multiple of 256: Quark's 64
    assert awq_clip.rows_per_call(100, 10**9, 512, 4, LIMITS) == 1  # never zero
    for out, inp in ((4096, 14336), (14336, 4096), (2048, 8192)):
        assert awq_clip.rows_per_call(out, inp, 512, 2, LIMITS) * 512 * inp * 2 <= LIMITS["chunk_bytes"]


def test_the_limits_are_the_memory_models():
    from raipack.stages.quantize.memory import model_data

    assert awq_clip.clip_limits() == model_data()["awq_clip"]
    assert awq_clip.clip_limits()["chunk_bytes"] == 256 << 20


def _quant_linear(out_features: int, in_features: int, dtype):
    import torch
    from quark.torch.quantization.nn.modules.quantize_linear import QuantLinear

    from raipack.stages.quantize import awq_groups

    qconfig = awq_groups.template("llama", "test").get_config(scheme="uint4_wo_128", algorithm=None, kv_cache_scheme=None, exclude_layers=[],
                                                           layer_config=None, algo_configs=None)
    linear = torch.nn.Linear(in_features, out_features, bias=False, dtype=dtype)
    torch.nn.init.normal_(linear.weight, std=0.05)
    return QuantLinear.from_float(linear, qconfig.global_quant_config)


def _processor():
    import torch
    from quark.torch.algorithm.awq.awq import AwqProcessor

    processor = object.__new__(AwqProcessor)  # only the two attributes the search reads
    processor.using_accelerate, processor.device = False, torch.device("cpu")
    return processor


@pytest.mark.parametrize("out_features,in_features,tokens,dtype_name,chunk_rows", [
    (512, 256, 96, "float32", 37),  # Quark: one batch of 256 rows twice; here 37 rows a call, the last 31
    (320, 384, 200, "bfloat16", 50),  # out not a multiple of 256: Quark's batches of 64
    (256, 256, 1100, "bfloat16", 1),  # more tokens than Quark samples (stride 2), one row a call
])
def test_the_bounds_are_quarks_bit_for_bit(out_features, in_features, tokens, dtype_name, chunk_rows):
    import torch

    from raipack.stages.quark_import import import_quark

    import_quark()
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(out_features + tokens)
    linear = _quant_linear(out_features, in_features, dtype)
    feat = torch.randn(tokens, in_features, dtype=dtype)
    weight_before = linear.weight.detach().clone()
    with torch.no_grad():
        theirs = _processor()._compute_best_clip(linear, feat)
    sampled = awq_clip.sampled_tokens(tokens, 512)
    limits = {**LIMITS, "chunk_bytes": chunk_rows * sampled * in_features * feat.element_size()}
    with awq_clip.bounded_clip_search(limits) as calls, torch.no_grad():
        mine = _processor()._compute_best_clip(linear, feat)
    assert calls == [chunk_rows]
    assert mine.shape == theirs.shape and mine.dtype == theirs.dtype
    assert torch.equal(mine, theirs)
    assert torch.equal(linear.weight, weight_before)  # the search reads the weight, it never writes it


def test_the_patch_is_undone_also_after_a_failure():
    from raipack.stages.quark_import import import_quark

    import_quark()
    from quark.torch.algorithm.awq.awq import AwqProcessor

    before = (AwqProcessor._compute_best_clip, AwqProcessor._search_best_clip)
    with pytest.raises(RuntimeError), awq_clip.bounded_clip_search(LIMITS):
        assert AwqProcessor._compute_best_clip is not before[0]
        raise RuntimeError("inside")
    assert (AwqProcessor._compute_best_clip, AwqProcessor._search_best_clip) == before


def test_the_heap_is_trimmed_before_each_clipping_search(monkeypatch):
    from raipack.stages.quark_import import import_quark

    import_quark()
    trims = []
    monkeypatch.setattr(awq_clip, "trim_heap", lambda: trims.append(1) or True)
    processor = _processor()
    with awq_clip.bounded_clip_search(LIMITS):
        assert processor._search_best_clip({}, {}) == []
        assert processor._search_best_clip({}, {}) == []
    assert len(trims) == 2
