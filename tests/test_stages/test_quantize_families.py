"""The quantize stage for every issue-14 family: Quark 0.13's AWQ with AMD's recipe, the scaling groups
AWQ applied listed in the report, and the quantized lm_head option through every stage.

Quark runs on one tiny model per distinct set of AWQ scaling groups: Qwen2.5 (Quark's Llama-shaped
groups, the same for llama, mistral and qwen2; built end to end with lm_head = 32), Qwen3 (raipack's
groups, data/awq.json), Phi-4-mini (packed qkv / gate_up) and Gemma 3 (pre_feedforward_layernorm).
That every family's groups are applied in every layer of a build is tests/test_families.py's.
The models are untrained (which groups AWQ scales does not depend on what the weights learned) but
the built one, trained a few steps so the smoke stage's greedy tokens are not a tie-break; AWQ
calibrates on one window of 32 tokens. Every Quark case is in one xdist group: one worker imports
Quark once and makes each model once.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from raipack.core.errors import RaipackError
from raipack.npu import profile as profiles
from raipack.stages.quantize import awq_groups
from raipack.stages.quantize.memory import Shape
from raipack.stages.quantize.preflight import linear_shapes, resolve_lm_head
from raipack.stages.quantize.quark_awq import quantize
from raipack.validate import validate
from seed_models import FAMILIES, make_tiny_model

QUARK = pytest.mark.xdist_group("quark-families")
# What AWQ must scale per model type: prev_op -> linears (Quark's AWQ_MAP, or data/awq.json for qwen3).
LLAMA_GROUPS = [("input_layernorm", ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]),
                ("self_attn.v_proj", ["self_attn.o_proj"]),
                ("post_attention_layernorm", ["mlp.gate_proj", "mlp.up_proj"]),
                ("mlp.up_proj", ["mlp.down_proj"])]
EXPECTED = {
    "llama": LLAMA_GROUPS, "mistral": LLAMA_GROUPS, "qwen2": LLAMA_GROUPS, "qwen3": LLAMA_GROUPS,
    "phi3": [("input_layernorm", ["self_attn.qkv_proj"]), ("self_attn.qkv_proj", ["self_attn.o_proj"]),
             ("post_attention_layernorm", ["mlp.gate_up_proj"]), ("mlp.gate_up_proj", ["mlp.down_proj"])],
    "gemma3_text": [LLAMA_GROUPS[0], LLAMA_GROUPS[1], ("pre_feedforward_layernorm", ["mlp.gate_proj", "mlp.up_proj"]), LLAMA_GROUPS[3]],
}
BUILT = "qwen2.5-1.5b"  # tied embeddings: its lm_head is quantized (g32) on its own copy, built for 1.8.0-npu-16K
# Other families' AWQ runs are the family matrix's (tests/test_families.py asserts every group applied in
# every layer of every family's build); here only the Qwen2.5 build's, with its quantized lm_head.
QUANTIZED: list[str] = []
PROFILE = "1.8.0-npu-16K"
SMOKE_MAX_TIER = 256


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """family -> its tiny model folder, made on first use."""
    root = tmp_path_factory.mktemp("qfam-models")
    made: dict = {}

    def get(family: str) -> Path:
        if family not in made:
            made[family] = make_tiny_model(family, root / family, train_steps=8 if family == BUILT else 0)
        return made[family]

    return get


@pytest.fixture(scope="module")
def built_lm_head_32(models, tmp_path_factory):
    """The BuildResult of the Qwen2.5 stand-in with [quantize] lm_head = 32, through every stage."""
    from raipack.builder.recipe import load
    from raipack.builder.runner import build

    root = tmp_path_factory.mktemp("qfam-build")
    recipe = load(None, {"model": str(models(BUILT)), "name": "Qwen2.5-tiny-lmhead-g32", "profile": PROFILE, "output": str(root / "build"),
                         "quantize.lm_head": 32, "quantize.num_samples": 1, "quantize.seq_len": 32, "smoke.max_tier": SMOKE_MAX_TIER,
                         "smoke.numerics": "float"})  # BFP16 is not under test here
    return build(recipe, cache_root=root / "cache")


def _stage(result, name: str):
    return next(s for s in result.stages if s.name == name)


@pytest.fixture(scope="module")
def quantized(models, request, tmp_path_factory):
    """family -> (source folder, quantize report, Quark export folder): the build's quantize stage for
    Qwen2.5, quantize() with lm_head excluded for the others."""
    root = tmp_path_factory.mktemp("qfam")
    done: dict = {}

    def get(family: str):
        if family not in done:
            if family == BUILT:
                stage = _stage(request.getfixturevalue("built_lm_head_32"), "quantize")
                done[family] = (models(family), stage.report, Path(stage.path))
            else:
                out = root / f"{family}.quark"
                done[family] = (models(family), quantize(models(family), out, group_size="auto", num_samples=1, seq_len=32), out)
        return done[family]

    return get


def _qc(out: Path) -> dict:
    return json.loads((out / "config.json").read_text())


@QUARK
@pytest.mark.parametrize("model_type", sorted({spec["config"]["model_type"] for spec in FAMILIES.values()}))
def test_awq_groups_configured_for_every_model_type(model_type):
    """Every family's model type has AWQ scaling groups (Quark's or raipack's), the expected ones."""
    from raipack.stages.quark_import import import_quark

    import_quark()
    config, source = awq_groups.awq_config(model_type)
    assert source == ("raipack (stages/quantize/data/awq.json)" if model_type == "qwen3" else "quark")
    assert [(g["prev_op"], g["layers"]) for g in awq_groups.configured_groups(model_type, config)] == EXPECTED[model_type]


@QUARK
@pytest.mark.parametrize("family", [BUILT, *QUANTIZED])
def test_awq_scales_every_group_of_the_family(quantized, family):
    src, report, out = quantized(family)
    lm_head = 32 if family == BUILT else "exclude"
    cfg = FAMILIES[family]["config"]
    layers = json.loads((src / "config.json").read_text())["num_hidden_layers"]
    awq = report["awq"]
    got = [(g["prev_op"], g["layers"]) for g in awq["scaling_groups"]]
    assert got == [(p, ls) for p, ls in EXPECTED[cfg["model_type"]]]
    assert all(g["decoder_layers_scaled"] == layers and g["decoder_layers_failed"] == 0 for g in awq["scaling_groups"]), awq
    assert awq["linears_scaled"] == report["layers_quantized"] - (lm_head != "exclude")  # every decoder linear, not lm_head
    assert awq["source"] == ("raipack (stages/quantize/data/awq.json)" if cfg["model_type"] == "qwen3" else "quark")
    # AMD's recipe: uint4 asymmetric per group, the largest group that divides the widths, reorder, no KV quantization
    qc = _qc(out)["quantization_config"]
    weight = qc["global_quant_config"]["weight"]
    hidden = json.loads((src / "config.json").read_text())["hidden_size"]
    assert (weight["dtype"], weight["qscheme"], weight["symmetric"]) == ("uint4", "per_group", False)
    assert weight["group_size"] == report["group_size"] == (128 if hidden % 128 == 0 else 64)
    assert qc["export"]["pack_method"] == "reorder" and qc["kv_cache_quant_config"] == {}
    assert ("lm_head" in qc["exclude"]) == (lm_head == "exclude")
    findings = [f for f in validate(out, "quark-export").findings if f.severity in ("error", "warning")]
    assert findings == [], [(f.check_id, f.message) for f in findings]


@QUARK
def test_tied_lm_head_quantized_on_its_own_copy(quantized):
    """Quark fake-quantizes a tied lm_head's shared parameter in place; raipack unties it first, so the
    embedding table the token gather reads stays the source's float table."""
    from safetensors.torch import load_file

    src, report, out = quantized(BUILT)
    assert json.loads((src / "config.json").read_text())["tie_word_embeddings"] is True
    assert report["lm_head"] == {"group_size": 32, "scheme": "uint4_wo_32", "untied_from_embedding": True}
    cfg = _qc(out)
    assert cfg["tie_word_embeddings"] is False
    head = cfg["quantization_config"]["layer_quant_config"]["lm_head"]["weight"]
    assert (head["dtype"], head["group_size"], head["symmetric"]) == ("uint4", 32, False)
    exported = {k: v for f in out.glob("*.safetensors") for k, v in load_file(f).items()}
    source = {k: v for f in src.glob("*.safetensors") for k, v in load_file(f).items()}
    assert exported["model.embed_tokens.weight"].equal(source["model.embed_tokens.weight"])
    assert exported["lm_head.weight_scale"].shape[0] == cfg["hidden_size"] // 32  # one scale per 32 inputs
    assert math.isfinite(report["quality"]["ppl_quantized"])  # the export with its quantized head reloads in transformers


@QUARK
def test_lm_head_32_through_every_stage(built_lm_head_32):
    """[quantize] lm_head = 32 for 1.8.0-npu-16K: the package validates clean, the fused graph computes the
    logits with a QMatMul of block 32 (not a float MatMul on the CPU), the reference runtime matches the
    unfused export at every tier up to SMOKE_MAX_TIER, and the build records the setting."""
    import onnx

    result = built_lm_head_32
    pkg = Path(result.package)
    check = validate(pkg)
    assert check.profile == "reference-16K", check.profile_reason
    assert [(f.check_id, f.severity, f.message) for f in check.findings if f.severity in ("error", "warning", "advice")] == []

    graph = onnx.load(str(pkg / "model.onnx"), load_external_data=False).graph
    head = next(n for n in graph.node if "logits" in n.output)
    assert head.op_type == "QMatMul", (head.op_type, head.name)
    op = json.loads((pkg / "cache" / f"{head.name}_meta.json").read_text())["op_list"][0]
    assert (op["name"].endswith("/lm_head"), op["attrs"]["bits"], op["attrs"]["block_size"]) == (True, 4, 32)

    smoke = _stage(result, "smoke").report
    tiers = [t for t in profiles.get(PROFILE).buckets.prefill if t <= SMOKE_MAX_TIER]
    assert smoke["tokens_match_export"] and [t["tier"] for t in smoke["tiers"]] == tiers and len(tiers) > 2
    assert all(t["tokens_match_export"] and t["finite"] for t in smoke["tiers"])

    report = json.loads((pkg / "report.json").read_text())
    quantize_report = next(s["report"] for s in report["stages"] if s["name"] == "quantize")
    assert quantize_report["lm_head"]["group_size"] == 32 and "lm_head g32" in quantize_report["summary"]
    stage_manifest = json.loads((Path(_stage(result, "quantize").path) / "manifest.json").read_text())
    assert stage_manifest["stage"]["config"]["lm_head"] == 32  # what the quantize stage's cache key hashed
    assert _qc(pkg)["quantization_config"]["layer_quant_config"]["lm_head"]["weight"]["group_size"] == 32


@QUARK
def test_awq_that_scales_nothing_is_a_build_failure(models, tmp_path, monkeypatch):
    """Refused right after AWQ, before anything is exported: no round-to-nearest model under AWQ's name."""
    wrong = {"configs": {"qwen3": {"model_decoder_layers": "model.layers", "scaling_layers": [
        {"prev_op": "input_norm", "layers": ["attn.q"], "inp": "attn.q"}]}}, "templates": {}}
    monkeypatch.setattr(awq_groups, "awq_data", lambda: wrong)
    with pytest.raises(RaipackError, match="AWQ scaled no layer of this qwen3 model"):
        quantize(models("qwen3-1.7b"), tmp_path / "out", num_samples=1, seq_len=32)
    assert not (tmp_path / "out").exists()


def test_summary_names_what_awq_scaled():
    from raipack.stages.quantize.stage import summary

    record = awq_groups.summarize([{"prev_op": "input_layernorm", "layers": ["self_attn.q_proj"]}, {"prev_op": "mlp.up_proj", "layers": ["mlp.down_proj"]}],
                                  [("input_layernorm", ("self_attn.q_proj",), True)] * 2 + [("mlp.up_proj", ("mlp.down_proj",), False)] * 2, 2, "quark")
    assert record["linears_scaled"] == 2
    assert awq_groups.check_applied(record, "llama", "m") == ["AWQ scaled mlp.up_proj -> mlp.down_proj in 0 of 2 decoder layers"]
    line = summary("awq", {"group_size": 128, "layers_quantized": 14, "lm_head": {"group_size": 32}, "awq": record})
    assert "lm_head g32" in line and "input_layernorm -> q_proj x2" in line and "mlp.up_proj -> down_proj x0" in line
    with pytest.raises(RaipackError, match="scaled no layer"):
        awq_groups.check_applied(awq_groups.summarize([], [], 2, "quark"), "llama", "m")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_preflight_and_memory_know_every_family_linear(family):
    cfg = FAMILIES[family]["config"]
    shapes = linear_shapes(cfg)
    assert shapes is not None, cfg["model_type"]
    layer0 = [(n.rsplit(".", 1)[-1], fi, fo) for n, fi, fo in shapes if n.startswith("model.layers.0.")]
    assert layer0 == Shape.from_config(cfg).linears()
    assert len(shapes) == cfg["num_hidden_layers"] * len(layer0) + 1  # + lm_head


def test_lm_head_option_refused_with_one_sentence():
    assert resolve_lm_head({"hidden_size": 192}, "exclude") == "exclude"
    assert resolve_lm_head({"hidden_size": 192}, 64) == 64
    with pytest.raises(RaipackError, match="hidden_size 192.*not a multiple of .*128") as err:
        resolve_lm_head({"hidden_size": 192}, 128, "m/config.json")
    assert err.value.hint == "use lm_head = 64"
    with pytest.raises(RaipackError, match="expected \"exclude\" or one of 128, 64, 32"):
        resolve_lm_head({}, 48)


def test_lm_head_enters_the_cache_key_and_recipe_schema():
    from raipack.builder.config import config_dict, parse_config
    from raipack.builder.recipe import RecipeError, load
    from raipack.stages.quantize.stage import QuantizeConfig

    assert load(None, {"quantize.lm_head": 32}).stages["quantize"] == {"lm_head": 32}
    with pytest.raises(RecipeError, match="lm_head"):
        load(None, {"quantize.lm_head": 16})
    a = config_dict(parse_config(QuantizeConfig, {}, "[quantize]"))
    b = config_dict(parse_config(QuantizeConfig, {"lm_head": 32}, "[quantize]"))
    assert a["lm_head"] == "exclude" and b["lm_head"] == 32  # the stage config is what the cache key hashes


def _head_config(group: int, symmetric: bool = False):
    def fn(doc):
        q = doc["quantization_config"]
        q["exclude"] = []
        q["layer_quant_config"] = {"lm_head": {"weight": dict(q["global_quant_config"]["weight"], group_size=group, symmetric=symmetric)}}
    return fn


@pytest.mark.parametrize("profile,group,symmetric,expected", [
    ("1.8.0-hybrid", 32, False, None),           # AMD's hybrid checkpoints: lm_head g32
    ("1.8.0-hybrid", 64, False, "error"),        # a group the profile does not list
    ("1.8.0-npu-16K", 32, False, None),          # older Quark wrote lm_head g32 into AMD's packages too (AMD_PACKAGES.md)
    ("1.8.0-npu-16K", 64, False, "error"),       # but no other group
    ("reference-16K", 32, False, None),          # what raipack builds with [quantize] lm_head = 32
    ("reference-16K", 32, True, "error"),        # symmetric: not the recipe
])
def test_rp301_reads_lm_head_against_the_profile(make_pkg, profile, group, symmetric, expected):
    from helpers import edit_json

    pkg = make_pkg(profile)
    if "quantization_config" not in json.loads((pkg / "config.json").read_text()):  # AMD's hybrid packages ship config.json {}
        shutil.copyfile(make_pkg("1.8.0-npu-16K") / "config.json", pkg / "config.json")  # one that keeps Quark's config
    edit_json(pkg / "config.json", _head_config(group, symmetric))
    hits = [f for f in validate(pkg, profile).findings if f.check_id == "RP301"]
    assert [f.severity for f in hits] == ([expected] if expected else []), [f.message for f in hits]
    assert all("lm_head" in f.message and f.hint for f in hits)
