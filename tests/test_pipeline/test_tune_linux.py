"""Windows-built packages on Linux, as AMD documents it per release (docs/llm_linux.rst, the catalog's
`linux` blocks): `validate --platform linux` and `doctor` name the edits, `tune --platform linux`
makes the file edits atomically (with backups) and says which name the user's install."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from factory import make_package
from helpers import run_cli
from raipack import doctor
from raipack.npu import linux
from raipack.runtime import probes
from raipack.validate import validate

GENAI = "genai_config.json"
META = ".cache/MatMulNBits_0_0_meta.json"
SESSION = ("model", "decoder", "session_options")


def _windows_meta(pkg: Path) -> None:
    """AMD's 1.6 meta files name their .const files with Windows paths."""
    doc = json.loads((pkg / META).read_text())
    for entry in doc["tensor_map"].values():
        entry["file_name"] = ".cache\\" + entry["file_name"]
    (pkg / META).write_text(json.dumps(doc, indent=2))


@pytest.fixture
def amd16(tmp_path) -> Path:
    pkg = make_package(tmp_path, "1.6-npu")
    _windows_meta(pkg)
    return pkg


def _session(pkg: Path) -> dict:
    node = json.loads((pkg / GENAI).read_text())
    for key in SESSION:
        node = node[key]
    return node


def test_validate_names_amds_linux_edits_only_with_platform_linux(amd16):
    assert not [f for f in validate(amd16).findings if f.check_id == "RP407"]
    found = [f for f in validate(amd16, platform="linux").findings if f.check_id == "RP407"]
    assert [(f.path, f.severity) for f in found] == [(GENAI, "error"), (GENAI, "error"), (META, "error")]
    assert "libonnx_custom_ops.so" in found[0].message and "names your install" in found[0].message
    assert "hybrid_dbg_use_aie_rope" in found[1].message and "names your install" not in found[1].message
    assert "2 line(s)" in found[2].message and "tune --platform linux" in found[2].hint


def test_validate_cli_takes_platform(amd16, capsys):
    code, out, _ = run_cli(capsys, "validate", amd16, "--platform", "linux")
    assert code == 1 and "RP407" in out
    code, out, _ = run_cli(capsys, "validate", amd16)
    assert "RP407" not in out


def test_tune_platform_linux_makes_the_edits_and_keeps_backups(amd16, capsys):
    before_genai, before_meta = (amd16 / GENAI).read_bytes(), (amd16 / META).read_bytes()
    code, out, _ = run_cli(capsys, "tune", amd16, "--platform", "linux", "--dry-run")
    assert code == 0 and "dry run: nothing written" in out and (amd16 / GENAI).read_bytes() == before_genai
    code, out, _ = run_cli(capsys, "tune", amd16, "--platform", "linux")
    assert code == 0, out
    session = _session(amd16)
    assert session["custom_ops_library"] == "deployment/lib/libonnx_custom_ops.so"
    assert session["config_entries"]["hybrid_dbg_use_aie_rope"] == "0"
    assert session["config_entries"]["hybrid_opt_token_backend"] == "npu"  # the rest kept
    meta = (amd16 / META).read_text()
    assert "\\" not in meta and ".cache/MatMulNBits_0_0_wts.const" in meta  # a Windows separator (an escaped pair in JSON) becomes one slash
    assert "[names your install" in out and "export LD_LIBRARY_PATH=deployment/lib" in out
    backups = sorted(p.name for p in amd16.rglob("*.bak"))
    assert len(backups) == 2 and {(amd16 / GENAI).with_name(b).read_bytes() for b in backups if b.startswith(GENAI)} == {before_genai}
    assert next(amd16.joinpath(".cache").glob("*.bak")).read_bytes() == before_meta
    assert not [f for f in validate(amd16, platform="linux").findings if f.check_id == "RP407"]
    code, out, _ = run_cli(capsys, "tune", amd16, "--platform", "linux")  # a second run finds nothing to do
    assert code == 0 and "no file to edit" in out


def test_a_release_that_runs_on_linux_as_published_needs_no_edit(tmp_path, capsys):
    pkg = make_package(tmp_path, "1.8.0-npu-16K")
    assert not [f for f in validate(pkg, platform="linux").findings if f.check_id == "RP407"]
    code, out, _ = run_cli(capsys, "tune", pkg, "--platform", "linux", "--dry-run")
    assert code == 0 and "no file to edit" in out and "memlock" in out and "RYZENAI_EP_PATH" in out


def test_hybrid_on_linux_is_refused_where_the_release_says_so(tmp_path, capsys):
    pkg = make_package(tmp_path, "1.8.0-hybrid")
    (finding,) = [f for f in validate(pkg, platform="linux").findings if f.check_id == "RP407"]
    assert finding.severity == "error" and "runs no hybrid package on Linux" in finding.message
    before = (pkg / GENAI).read_bytes()
    code, _, err = run_cli(capsys, "tune", pkg, "--platform", "linux")
    assert code == 1 and "hybrid" in err and (pkg / GENAI).read_bytes() == before


def test_what_amds_linux_steps_do_not_cover_is_a_warning(tmp_path, capsys, monkeypatch):
    pkg = make_package(tmp_path, "1.7.1-hybrid")  # 1.7.1's Linux page runs an NPU package; of hybrid ones it says nothing
    (finding,) = [f for f in validate(pkg, platform="linux").findings if f.check_id == "RP407"]
    assert finding.severity == "warning" and "cover its NPU packages only" in finding.message
    code, _, err = run_cli(capsys, "tune", pkg, "--platform", "linux")
    assert code == 1 and "will not guess" in err
    monkeypatch.setattr(linux, "deployment", lambda release: None)  # a release with no Linux page at all
    (finding,) = [f for f in validate(pkg, platform="linux").findings if f.check_id == "RP407"]
    assert finding.severity == "warning" and "AMD documents no Linux deployment for Ryzen AI 1.7.1" in finding.message


def test_platform_takes_no_length_option(amd16, capsys):
    code, _, err = run_cli(capsys, "tune", amd16, "--platform", "linux", "--max-length", 2048)
    assert code == 2 and "run raipack tune twice" in err


def test_doctor_on_linux_lists_the_edits(amd16, monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(probes, "npu_device", lambda: {"present": True, "driver": "loaded", "device": "DEV_17F0", "detail": "fake"})
    env = {"platform": "linux", "sdk": {"version": None}, "release": None, "onnxruntime_genai": None, "npu": probes.npu_device()}
    _, problems = doctor.check_package(doctor.open_package(amd16), env)
    linux = [p for p in problems if p.code == "DR110"]
    assert len(linux) == 3 and all(p.severity == "error" and "tune --platform linux" in p.hint for p in linux)
    env["platform"] = "win32"
    _, problems = doctor.check_package(doctor.open_package(amd16), env)
    assert not [p for p in problems if p.code == "DR110"]
