"""Gemma 3 (Gemma3ForCausalLM, model_type gemma3_text) through every stage (issue 14).

One tiny model of Gemma-3-4b's text config shape (tests/data/families.json: 6 layers = 5 sliding with
a 192-token window : 1 global, head_dim 64, query_pre_attn_scalar 64, rope theta 1e6 on the global
layer with linear scaling 8, 1e4 on the sliding ones; gemma-3-1b differs only in having no scaling)
is built for 1.8.0-npu-16K and 1.8.0-npu-4K, sharing one stage cache. Quantization is RTN: which AWQ
groups Gemma gets is the quantize stage's test (test_quantize_families.py); here the graph is what
matters, and RTN keeps the module within its time budget.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from raipack.builder.recipe import load
from raipack.builder.runner import build
from raipack.validate import validate
from seed_models import FAMILIES, make_tiny_model, tiny_config
from shared_fixtures import TRAIN_TEXT

pytestmark = pytest.mark.xdist_group("gemma3")

FAMILY = "gemma-3-4b"
PROFILES = ["1.8.0-npu-16K", "1.8.0-npu-4K"]
SMOKE_MAX_TIER = 1024
FUSED = {"RMSNormQKV": 1, "SkipRMSNormQKV": 5, "GQARope": 6, "OProjSandwichRMSNorm": 6, "GeluGatedMLPRMSNorm": 6}


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """profile → BuildResult of the tiny Gemma 3 model."""
    root = tmp_path_factory.mktemp("gemma3")
    model = make_tiny_model(FAMILY, root / "model", train_steps=30)
    out = {}
    for profile in PROFILES:
        recipe = load(None, {"model": str(model), "name": "gemma-3-4b-it", "profile": profile, "output": str(root / "build"),
                             "quantize.algorithm": "rtn", "smoke.max_tier": SMOKE_MAX_TIER, "smoke.numerics": "float"})  # BFP16 is not under test here
        out[profile] = build(recipe, cache_root=root / "cache")
    return out


def stage(result, name: str):
    return next(s for s in result.stages if s.name == name)


@pytest.mark.parametrize("profile", PROFILES)
def test_every_layer_fused_and_the_package_validates_clean(gemma, profile):
    result = gemma[profile]
    fuse = stage(result, "fuse").report
    assert fuse["fused_counts"] == FUSED and fuse["npu_complete"]
    assert {c["why"] for c in fuse["cpu_nodes"]} <= {"embedding or mask arithmetic", "mask and logits-row arithmetic", "final norm",
                                                     "lm_head in float (kept on the CPU, as Quark excluded it)"}
    check = validate(Path(result.package))
    assert check.findings == []  # no error, warning or advice (RP907's CPU fallback included)
    assert not validate(Path(result.package), profile).failed()  # and as AMD's release profile
    smoke = stage(result, "smoke").report
    assert smoke["device"] == "cpu-reference" and smoke["tokens_match_export"]
    tiers = [t["tier"] for t in smoke["tiers"]]
    assert tiers[-1] == SMOKE_MAX_TIER and all(t["tokens_match_export"] and t["finite"] for t in smoke["tiers"])


def test_sliding_and_global_layers_keep_their_window_and_rope(gemma):
    import onnx
    from onnx import helper, numpy_helper

    cfg = tiny_config(FAMILY)
    window, pattern = cfg["sliding_window"], cfg["sliding_window_pattern"]
    pkg = Path(gemma[PROFILES[0]].package)
    graph = onnx.load(str(pkg / "model.onnx"), load_external_data=False).graph
    attn = sorted((n for n in graph.node if n.op_type == "GQARope"), key=lambda n: int(n.name.rsplit("_", 1)[1]))
    got = [(helper.get_attribute_value(next(a for a in n.attribute if a.name == "attn_local_window_size")), next(i for i in n.input if i.startswith("cos_cache")))
           for n in attn]
    want = [(-1, "cos_cache_global") if (k + 1) % pattern == 0 else (window, "cos_cache_local") for k in range(cfg["num_hidden_layers"])]
    assert got == want

    # the caches themselves: the global layers' base with linear scaling, the sliding layers' base without
    export = onnx.load(str(Path(stage(gemma[PROFILES[0]], "export").path) / "model.onnx"))
    caches = {t.name: numpy_helper.to_array(t) for t in export.graph.initializer if t.name.startswith("cos_cache_")}
    dim = cfg["head_dim"]
    steps = np.arange(0, dim, 2) / dim
    for name, theta, factor in (("cos_cache_global", cfg["rope_theta"], cfg["rope_scaling"]["factor"]), ("cos_cache_local", cfg["rope_local_base_freq"], 1.0)):
        positions = np.arange(4096)[:, None]  # float32 angles lose ~1e-3 beyond
        np.testing.assert_allclose(caches[name][:4096], np.cos(positions * (1.0 / (factor * theta ** steps))), atol=2e-3, err_msg=name)


def test_export_matches_transformers_past_the_window(gemma):
    """The builder's graph (with stages/export/families.py's fixes) against the Quark model in transformers."""
    parity = stage(gemma[PROFILES[0]], "export").report["parity"]
    assert parity["perplexity"]["tokens"] > tiny_config(FAMILY)["sliding_window"]
    assert abs(parity["perplexity"]["ratio"] - 1) < 1e-3 and parity["greedy_identical"]


@pytest.mark.parametrize("profile", PROFILES)
def test_decode_across_the_window_matches_the_export(gemma, profile):
    """A prompt inside the window whose generation runs past it: the sliding layers stop seeing the first tokens."""
    from tokenizers import Tokenizer

    from raipack.runtime.ortloop import OrtDecoder
    from raipack.runtime.reference import ReferenceRuntime

    result = gemma[profile]
    pkg = Path(result.package)
    rt = ReferenceRuntime(pkg, threads=1)
    export = OrtDecoder(Path(stage(result, "export").path), threads=1)
    window = json.loads((pkg / "config.json").read_text())["sliding_window"]
    prompt = Tokenizer.from_file(str(pkg / "tokenizer.json")).encode(TRAIN_TEXT).ids[:window - 40]
    steps = 80
    assert len(prompt) + steps > window + 32 and FAMILIES[FAMILY]["tiny"]["sliding_window"] == window
    want, _ = export.greedy(prompt, steps, chunk_size=rt.chunk_size)
    assert list(rt.generate(prompt, steps)) == list(want)
