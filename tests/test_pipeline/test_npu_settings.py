"""One model of a package's NPU settings (pipeline/npu/settings.py): the fuse stage writes what the
advice checks recommend, so a package raipack builds passes raipack's own advice."""

from __future__ import annotations

import json
import shutil

import pytest

from factory import reference_export, write_manifest
from raipack.npu.profile import all_profiles, get
from raipack.npu.settings import NpuSettings, SettingsError
from raipack.validate import validate

REFERENCE = sorted(pid for pid, p in all_profiles().items() if p.target == "reference")


def _advice(pkg):
    return [f"{f.check_id} {f.path}: {f.message}" for f in validate(pkg).findings if f.severity == "advice"]


@pytest.mark.parametrize("pid", REFERENCE)
def test_every_reference_package_passes_its_own_advice(reference_packages, pid):
    pkg = reference_packages[pid]
    assert _advice(pkg) == []
    assert not [f for f in validate(pkg).findings if f.severity in ("error", "warning")]


@pytest.mark.parametrize("pid", ["reference-16K", "reference-1.7.1-16K"])
def test_a_model_of_8192_positions_gets_a_max_length_the_advice_accepts(pid):
    """SmolLM2's max_position_embeddings is 8192, below the 16K profiles' 16384: the fuse stage used to
    write the largest token tier below it, 8064, which RP005 then advised to retune to 4096."""
    settings = NpuSettings.from_profile(get(pid), 8192)
    assert settings.max_length == 8192 and settings.max_length % settings.chunk_size == 0
    assert settings.token[-2:] == [8064, 8192] and settings.prefill[-1] == 4096
    assert settings.max_prompt["1.8.0"] == 4096 and settings.chunked


def test_settings_read_back_from_files_equal_the_ones_written():
    profile = get("reference-16K")
    built = NpuSettings.from_profile(profile, 8192)
    genai = {"model": {"context_length": 8192, "decoder": {"session_options": {"provider_options": [{"RyzenAI": built.provider_options(profile)}]}}},
             "search": {"max_length": built.max_length, "chunk_size": built.chunk_size}}
    read = NpuSettings.from_configs(genai, {"max_prompt_length": built.max_prompt}, built.prefill, built.token)
    assert read.as_dict() == {**built.as_dict(), "kv_cache": None}
    assert read.single_pass() == 4096 and read.tier_rows()[-1]["padding"] == 0


def test_a_context_below_every_tier_is_one_sentence():
    with pytest.raises(SettingsError, match="context of 256 positions is below every token tier"):
        NpuSettings.from_profile(get("reference-16K"), 256)


@pytest.fixture(scope="module")
def fused_8192(reference_packages, tmp_path_factory):
    """The tiny reference model exported with 8192 positions (as SmolLM2), fused for reference-16K."""
    from raipack.stages.fuse.reference import fuse

    oga, quark = reference_export()
    base = tmp_path_factory.mktemp("ctx8192")
    export = base / "oga"
    shutil.copytree(oga, export)
    genai = json.loads((export / "genai_config.json").read_text())
    genai["model"]["context_length"] = 8192
    (export / "genai_config.json").write_text(json.dumps(genai))
    report = fuse(export, base / "pkg", get("reference-16K"), quark_dir=quark)
    write_manifest(base / "pkg", target_profile="1.8.0-npu-16K")
    return base / "pkg", report


def test_a_package_of_8192_positions_passes_its_own_advice_and_runs(fused_8192):
    from raipack.runtime.reference import ReferenceRuntime

    pkg, report = fused_8192
    assert report["findings"] == [] and report["lengths"]["max_length"] == 8192
    assert json.loads((pkg / "genai_config.json").read_text())["search"]["max_length"] == 8192
    assert (pkg / "dd_metastate_Llm_Token_decoder_8192.plan").is_file()
    assert _advice(pkg) == []
    assert not [f for f in validate(pkg).findings if f.severity == "error"]
    rt = ReferenceRuntime(pkg, threads=2, verify="sizes")
    assert rt.max_length == 8192 and rt.token_tiers[-1] == 8192
    assert len(rt.generate([1, 2, 3, 4], 3)) == 3
