"""The release catalog: profiles built from it, releases it does not know said out loud, a new
release added as one catalog entry (RAIPACK_RELEASES naming a temp copy), no code changed."""

from __future__ import annotations

import copy
import json

import pytest

from factory import make_package
from helpers import run_cli
from raipack.core.package import Package
from raipack.data import load_data
from raipack.npu import catalog
from raipack.npu import detect as detection
from raipack.npu import profile as profiles
from raipack.validate import validate


@pytest.fixture
def fake_release(tmp_path, monkeypatch):
    """A catalog copy with a fictitious Ryzen AI 9.9.0 that ships 1.8.0's variants, active for the test."""
    doc = copy.deepcopy(load_data("ryzenai_releases.json"))
    entry = copy.deepcopy(next(r for r in doc["releases"] if r["release"] == "1.8.0"))
    entry["release"] = "9.9.0"
    entry["max_prompt_length"] = {"value": 8192, "confidence": "unknown", "source": "a test's fictitious release"}
    for spec in entry["variants"].values():
        spec.get("reference", {}).pop("id", None)  # reference-9.9.0-<variant>, beside 1.8.0's
    doc["releases"].append(entry)
    path = tmp_path / "releases.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv(catalog.CATALOG_ENV, str(path))
    profiles.reload()
    yield entry
    monkeypatch.delenv(catalog.CATALOG_ENV)
    profiles.reload()


def test_release_profiles_are_built_from_templates_not_copied():
    built = catalog.release_profiles()
    assert {"1.6-npu", "1.7.1-npu-4K", "1.8.0-npu-16K", "1.8.0-hybrid", "reference-16K", "reference-1.7.1-hybrid"} <= set(built)
    p171, p180 = profiles.get("1.7.1-npu-16K"), profiles.get("1.8.0-npu-16K")
    assert p171.detect.name_patterns == ("*_rai_1.7.1_npu_16K",) and p180.release == "1.8.0"
    assert p171.advice.kv_cache_fusion is None and p180.advice.kv_cache_fusion is not None  # 1.7.1's `set` removes it (null)
    assert p171.max_prompt_length == catalog.prompt_table() and p171.max_prompt_length["1.3.1"] == 2048
    assert "1.6.0" not in profiles.get("1.3-npu").max_prompt_length  # prompt_table_until 1.5.1
    assert profiles.get("reference-16K").extends == "1.8.0-npu-16K"


def test_set_null_removes_a_key_and_templates_keep_their_nulls():
    assert catalog.apply({"a": {"x": 1, "y": 2}}, {"a": {"x": None}}) == {"a": {"y": 2}}
    assert catalog.apply({"a": 1}, {"b": None}, keep_null=True) == {"a": 1, "b": None}
    assert profiles.get("1.8.0-hybrid").fusion is None


def test_release_in_name():
    assert catalog.release_in_name("Phi-3.5-mini-instruct_rai_1.8.0_npu_16K") == ("1.8.0", "npu-16K")
    assert catalog.release_in_name("phi-4_rai_1.9.0_npu") == ("1.9.0", None)
    assert catalog.release_in_name("Qwen_rai_1.7.1_hybrid") == ("1.7.1", "hybrid")
    assert catalog.release_in_name("Llama-3.2-1B-onnx-ryzenai-npu") is None
    assert catalog.version_key("1.6") == catalog.version_key("1.6.0") < catalog.version_key("1.10")


def test_a_release_newer_than_the_catalog_is_named_and_never_another(tmp_path):
    """The folder name of AMD's 1.9.0 collection (no _4K/_16K) over a 1.8 token-fusion layout."""
    pkg = make_package(tmp_path, "1.8.0-npu-16K", name="phi-4_rai_1.9.0_npu")
    result = validate(pkg)
    assert result.profile == "1.8.0-npu-16K", result.profile_reason
    assert "1.9.0" in result.profile_reason and "newer than raipack's release catalog" in result.profile_reason
    warned = [f for f in result.findings if f.check_id == "RP108"]
    assert len(warned) == 1 and warned[0].severity == "warning"
    assert "Ryzen AI 1.9.0" in warned[0].message and "1.8.0-npu-16K" in warned[0].message
    assert "1.7.1" not in result.profile  # never silently an older release


def test_a_newer_release_with_a_variant_suffix_takes_that_variant(tmp_path):
    pkg = make_package(tmp_path, "1.8.0-npu-4K", name="Llama_rai_2.0.0_npu_4K")
    found = detection.detect(Package.scan(pkg))
    assert found.profile.id == "1.8.0-npu-4K" and found.unknown_release == "2.0.0"
    assert "the newest known release of variant npu-4K" in found.reason


def test_a_named_release_the_content_does_not_fit_is_said(tmp_path):
    pkg = make_package(tmp_path, "1.6-npu", name="Llama_rai_1.8.0_npu")
    result = validate(pkg)
    assert result.profile == "1.6-npu" and "names Ryzen AI 1.8.0, but the content fits none of its profiles" in result.profile_reason


def test_content_that_fits_two_releases_names_both_and_takes_the_newest(tmp_path):
    pkg = make_package(tmp_path, "1.8.0-npu-16K", name="my-package")
    result = validate(pkg)
    assert result.profile == "1.8.0-npu-16K"
    assert "1.7.1-npu-16K, 1.8.0-npu-16K" in result.profile_reason and "--profile" in result.profile_reason
    assert not [f for f in result.findings if f.check_id == "RP108"]
    assert validate(pkg, profile="1.7.1-npu-16K").profile == "1.7.1-npu-16K"  # --profile says otherwise


def test_a_name_amd_reuses_across_releases_does_not_decide_alone(tmp_path):
    """amd/<M>-onnx-ryzenai-npu with 1.7-style content (lemonade serves these names with its 1.7 backend)."""
    pkg = make_package(tmp_path, "1.8.0-npu-4K", name="Llama-3.2-1B-Instruct-onnx-ryzenai-npu")
    result = validate(pkg)
    assert result.profile == "1.8.0-npu-4K", result.profile_reason
    assert "a name AMD keeps across releases" in result.profile_reason
    assert not [f for f in result.findings if "fusion.onnx" in f.message]
    assert validate(make_package(tmp_path / "old", "1.6-npu")).profile == "1.6-npu"  # 1.6 content: the name's release


def test_adding_a_release_is_one_catalog_entry(tmp_path, fake_release, capsys):
    assert {"9.9.0-npu-4K", "9.9.0-npu-16K", "9.9.0-hybrid", "reference-9.9.0-npu-16K"} <= set(profiles.all_profiles())
    pkg = make_package(tmp_path, "9.9.0-npu-16K")
    assert pkg.name == "Llama-3.2-1B-Instruct_rai_9.9.0_npu_16K"
    result = validate(pkg)
    assert result.profile == "9.9.0-npu-16K", result.profile_reason
    assert [f for f in result.findings if f.severity in ("error", "warning")] == []
    assert profiles.get("1.8.0-npu-16K").max_prompt_length["9.9.0"] == 8192  # every profile's prompt table knows it
    code, out, _ = run_cli(capsys, "validate", pkg)
    assert code == 0 and "profile 9.9.0-npu-16K" in out
    # content alone now takes the new release, the newest that fits
    assert validate(make_package(tmp_path / "n", "9.9.0-npu-16K", name="plain")).profile == "9.9.0-npu-16K"


def test_a_catalog_naming_a_missing_template_is_one_sentence(tmp_path, monkeypatch, capsys):
    doc = copy.deepcopy(load_data("ryzenai_releases.json"))
    doc["releases"][-1]["variants"]["npu-4K"]["template"] = "no-such-template"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv(catalog.CATALOG_ENV, str(path))
    profiles.reload()
    try:
        code, _, err = run_cli(capsys, "profiles")
    finally:
        monkeypatch.delenv(catalog.CATALOG_ENV)
        profiles.reload()
    assert code == 2 and "no-such-template" in err and "Traceback" not in err


def test_the_target_enum_is_the_schemas():
    from raipack.core import schemas
    from raipack.npu.target import Target, target_of

    assert [t.value for t in Target] == schemas.load("profile")["properties"]["target"]["enum"]
    assert all(isinstance(p.target, Target) and p.target is target_of(p.document()) for p in profiles.all_profiles().values())
    assert {p.id for p in profiles.all_profiles().values() if p.target.is_amd} == {
        pid for pid in catalog.release_profiles() if not pid.startswith("reference")}


def test_one_families_table_feeds_the_input_check_quantize_export_and_fuse():
    from raipack.npu import families
    from raipack.stages.export.families import extra_options
    from raipack.stages.fuse.graph import gemma, patterns
    from raipack.stages.quantize.preflight import linear_shapes

    table = families.families()
    tiny = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_hidden_layers": 1, "vocab_size": 320}
    for model_type in table:
        shapes = linear_shapes({**tiny, "model_type": model_type})
        assert shapes is not None and shapes[-1] == ("lm_head", 256, 320), model_type
    assert linear_shapes({**tiny, "model_type": "granite"}) is None  # not a family raipack builds (the build refuses it)
    assert extra_options("mistral") == extra_options("gemma3_text") == {"windowed_kv_cache": "false"} and extra_options("llama") == {}
    assert patterns.family_matchers() == (gemma.match_layer,)
    assert list(families.supported()) == [f["architecture"] for f in table.values()]


def test_every_catalog_fact_says_where_it_comes_from():
    for rel in catalog.releases():
        for key in ("driver_minimum", "llm_devices", "max_prompt_length", "linux", "model_generate"):
            fact = rel.get(key)
            if fact:
                assert fact["source"] and fact["confidence"] in ("documented", "inferred", "unknown"), (rel["release"], key)
        if rel.get("linux"):
            assert all(e["why"] and isinstance(e["install_path"], bool) for e in rel["linux"]["package_edits"])


def test_each_variants_sdk_mode_is_one_amd_documents_for_its_release():
    for rel in catalog.releases():
        modes = (rel.get("model_generate") or {}).get("modes", [])
        for variant in rel.get("variants") or {}:
            sdk = profiles.get(catalog.profile_id(rel, variant)).sdk
            if sdk and modes:
                flag = f"--{sdk.mode}" + (f" --{sdk.recipe}" if sdk.recipe else "")
                assert any(m == flag or m.startswith(flag + " ") for m in modes), (rel["release"], variant, flag)
