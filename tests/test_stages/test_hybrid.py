"""Hybrid targets (NPU prefill, iGPU decode) with raipack's reference backend: 1.7.1-hybrid and 1.8.0-hybrid.

The packages are the session's reference packages (tests/factory.py fuses every reference profile,
reference-*-hybrid included, from one tiny export in about a second); the end-to-end build runs the
real fuse and smoke stages through the build runner on that export (the Quark and OGA stages are
stand-ins that copy it: they take minutes and are tested elsewhere)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from factory import reference_export, reference_package, write_json
from raipack.npu import profile as profiles
from raipack.validate import validate

RELEASES = ("1.8.0", "1.7.1")
HYBRID_FILES = ("model_jit.onnx", "model_jit.onnx.data", "model_jit.bin", "model_jit.pb.bin", "genai_config.json", "rai_config.json", "config.json")


def errors(result) -> list[str]:
    return [f"{f.check_id} {f.path}: {f.message}" for f in result.findings if f.severity == "error"]


def options(pkg: Path) -> dict:
    genai = json.loads((pkg / "genai_config.json").read_text())
    return genai["model"]["decoder"]["session_options"]["provider_options"][0]["RyzenAI"]


def set_options(pkg: Path, **changes) -> None:
    genai = json.loads((pkg / "genai_config.json").read_text())
    genai["model"]["decoder"]["session_options"]["provider_options"][0]["RyzenAI"].update(changes)
    write_json(pkg / "genai_config.json", genai)


@pytest.mark.parametrize("release", RELEASES)
def test_hybrid_is_a_build_target_with_a_reference_profile(release):
    target = profiles.get(f"{release}-hybrid")
    ref = profiles.reference_for(target)  # refused before: "has no reference profile, so raipack cannot build it"
    assert ref.id == f"reference-{release}-hybrid" and ref.layout.header == "model_jit.pb.bin"


@pytest.mark.parametrize("release", RELEASES)
def test_reference_hybrid_package_has_amds_hybrid_layout(release):
    pkg = reference_package(f"reference-{release}-hybrid")
    names = {p.relative_to(pkg).as_posix() for p in pkg.rglob("*") if p.is_file()}
    assert set(HYBRID_FILES) <= names
    assert not any(n.startswith(("model.", "dd_metastate_")) for n in names), sorted(names)  # no NPU names, no tiers
    assert not any(n.endswith(".schedule.json") for n in names)
    opts = options(pkg)
    assert opts == {"external_data_file": "model_jit.pb.bin", "hybrid_opt_free_after_prefill": "1", "hybrid_opt_max_seq_length": "4096"}
    genai = json.loads((pkg / "genai_config.json").read_text())
    assert genai["model"]["decoder"]["filename"] == "model_jit.onnx" and genai["search"]["max_length"] == 4096
    assert json.loads((pkg / "rai_config.json").read_text())["max_prompt_length"]["1.8.0"] == 4096
    assert json.loads((pkg / "config.json").read_text())["quantization_config"]["quant_method"] == "quark"


@pytest.mark.parametrize("release", RELEASES)
def test_reference_hybrid_package_validates_clean_detected_and_as_amds_profile(release):
    pkg = reference_package(f"reference-{release}-hybrid")
    auto = validate(pkg, "auto", verify_hashes=True)
    assert auto.profile == f"reference-{release}-hybrid", auto.profile_reason
    assert not auto.findings, errors(auto)
    amd = validate(pkg, f"{release}-hybrid")
    assert not errors(amd)


def test_without_its_manifest_the_hybrid_header_still_names_its_profile(tmp_path):
    pkg = shutil.copytree(reference_package("reference-1.8.0-hybrid"), tmp_path / "pkg")
    (pkg / "manifest.json").unlink()
    result = validate(pkg, "auto")
    assert result.profile == "reference-1.8.0-hybrid" and "model_jit.pb.bin" in result.profile_reason
    assert {f.check_id for f in result.findings if f.severity == "error"} == {"RP901"}  # RP901: raipack's header without raipack's manifest
    assert [(f.check_id, f.path) for f in result.findings if f.severity == "warning"] == [("RP107", "manifest.json")]  # no loader opens it


@pytest.mark.parametrize("release", RELEASES)
def test_reference_runtime_runs_hybrid_token_identical_to_the_export(release):
    from raipack.runtime.ortloop import OrtDecoder
    from raipack.runtime.reference import ReferenceRuntime

    rt = ReferenceRuntime(reference_package(f"reference-{release}-hybrid"), threads=2)
    assert rt.prefill_tiers == [] and rt.token_tiers == [] and rt.plans == {}
    dec = OrtDecoder(reference_export()[0], threads=2)
    for n in (1, 9, 300):
        prompt = [(7 * i) % 500 + 4 for i in range(n)]
        want, want_rows = dec.greedy(prompt, 24)
        got, got_rows = rt.generate(prompt, 24, return_logits=True)
        assert got == want
        assert max(float(abs(a - b).max()) for a, b in zip(want_rows, got_rows)) < 1e-4
        # one unpadded NPU prefill call, then every token over the whole KV buffer
        assert rt.calls[0] == ("prefill", n, 4096) and {c[0] for c in rt.calls[1:]} == {"token"}


def test_raipack_run_answers_a_hybrid_package(capsys):
    from raipack.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["run", str(reference_package("reference-1.8.0-hybrid")), "--prompt", "Paris is the capital of", "--max-new-tokens", "4"])
    out = capsys.readouterr()
    assert exc.value.code == 0, out.err
    assert "in 1 prefill call" in out.out + out.err


def test_hybrid_runtime_refuses_a_prompt_longer_than_one_pass(tmp_path):
    from raipack.runtime.reference import ReferenceRuntime, RuntimeRefusal

    rt = ReferenceRuntime(reference_package("reference-1.8.0-hybrid"), threads=1, verify="sizes")
    with pytest.raises(RuntimeRefusal, match="maximum prompt length of 4096"):
        rt.prefill([5] * 4097)


@pytest.mark.parametrize("release", RELEASES)
def test_amd_shaped_hybrid_packages_validate_clean(make_pkg, release):
    pkg = make_pkg(f"{release}-hybrid")
    assert (pkg / "model_jit.pb.bin").is_file() and (pkg / "model_jit.bin").is_file()
    assert json.loads((pkg / "config.json").read_text()) == {}
    assert "hybrid_opt_token_backend" not in options(pkg)
    result = validate(pkg, "auto")
    assert result.profile == f"{release}-hybrid"
    assert not errors(result), errors(result)


@pytest.mark.parametrize("change, check_id, words", [
    ({"hybrid_opt_max_seq_length": "3000"}, "RP4", "power of two"),
    ({"external_data_file": "missing.pb.bin"}, "RP4", "missing.pb.bin"),
    ({"hybrid_opt_token_backend": "cpu"}, "RP4", "cpu"),
])
@pytest.mark.parametrize("kind", ["amd", "raipack"])
def test_broken_hybrid_option_is_an_error(make_pkg, tmp_path, change, check_id, words, kind):
    if kind == "amd":
        pkg = make_pkg("1.8.0-hybrid")
        profile = "1.8.0-hybrid"
    else:
        pkg = shutil.copytree(reference_package("reference-1.8.0-hybrid"), tmp_path / "pkg")
        profile = "reference-1.8.0-hybrid"
    set_options(pkg, **change)
    found = [f for f in validate(pkg, profile).findings if f.severity == "error" and f.check_id.startswith(check_id)]
    assert any(words in f.message for f in found), [f"{f.check_id} {f.message}" for f in validate(pkg, profile).findings]


def test_hybrid_seq_length_beyond_its_pass_is_reported(tmp_path):
    pkg = shutil.copytree(reference_package("reference-1.8.0-hybrid"), tmp_path / "pkg")
    set_options(pkg, hybrid_opt_max_seq_length="2048")
    found = {f.check_id: f.message for f in validate(pkg, "reference-1.8.0-hybrid").findings if f.severity == "error"}
    assert "RP906" in found and "4096" in found["RP906"], found


def _copying_stage(name: str, source: Path, kind: str, inputs: tuple, profile_id: str):
    from dataclasses import dataclass

    from raipack.core.stage import Stage

    @dataclass(frozen=True)
    class Config:
        pass

    def run(job):
        for item in source.iterdir():
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, job.workdir / item.name)
        return {"summary": f"copied {source.name}"}

    return Stage(name, "1", Config, inputs, lambda job: profile_id, run, kind=kind)


@pytest.mark.parametrize("release", RELEASES)
def test_build_for_a_hybrid_target_runs_fuse_and_smoke(tmp_path, monkeypatch, release):
    """`raipack build --profile <release>-hybrid`: the real fuse (reference backend) and smoke stages
    through the runner; the package is validated as its reference profile and matches the export."""
    from raipack.builder import stages
    from raipack.builder.recipe import load
    from raipack.builder.runner import build

    oga, quark = reference_export()
    real = stages.get
    fakes = {"quantize": _copying_stage("quantize", quark, "quark", ("source",), "quark-export"),
             "export": _copying_stage("export", oga, "oga", ("quantize",), "oga-export")}
    monkeypatch.setattr(stages, "get", lambda name: fakes.get(name) or real(name))
    recipe = load(None, {"model": str(quark), "profile": f"{release}-hybrid", "output": str(tmp_path / "build"), "fuse.backend": "reference",
                         "smoke.max_new_tokens": 8, "smoke.tier_new_tokens": 2, "smoke.max_tier": 600, "smoke.numerics": "float"})  # BFP16: not under test here
    result = build(recipe, cache_root=tmp_path / "cache")
    pkg = Path(result.package)
    assert pkg.name.endswith(f"_rai_{release}_hybrid")
    smoke = json.loads((pkg.parent / f"{pkg.name}.stages" / "smoke" / "smoke.json").read_text())
    assert smoke["device"] == "cpu-reference" and smoke["tokens_match_export"] is True
    assert [t["prompt_tokens"] for t in smoke["tiers"]] == [598] and all(t["tokens_match_export"] for t in smoke["tiers"])
    assert smoke["overlong_prompt_refused"] is True
    check = validate(pkg, "auto")
    assert check.profile == f"reference-{release}-hybrid" and not check.findings, errors(check)
    assert not errors(validate(pkg, f"{release}-hybrid"))


def test_hybrid_runtime_refuses_a_pass_beyond_its_kv_buffer(tmp_path):
    from raipack.runtime.reference import PackageError, ReferenceRuntime

    pkg = shutil.copytree(reference_package("reference-1.8.0-hybrid"), tmp_path / "pkg")
    set_options(pkg, hybrid_opt_max_seq_length="8192")
    with pytest.raises(PackageError, match="hybrid_opt_max_seq_length is 8192"):
        ReferenceRuntime(pkg, threads=1, verify="sizes")
