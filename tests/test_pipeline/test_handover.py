"""The split build: quantize and export on one machine, a hand-over folder carried elsewhere, fuse there.

Fast fake stages (tests/fake_stages.py) stand in for source, quantize and export (the fake fuse takes
both, as the real one does); the SDK case runs the real fuse stage with the fake model_generate of
tests/test_stages/test_fuse_sdk.py. Each "machine" has its own cache and working folder."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

import fake_stages
from factory import make_package
from helpers import run_cli
from raipack.builder import cache, handover
from raipack.builder.recipe import load
from raipack.builder.runner import build
from raipack.core import manifest
from raipack.core.errors import RaipackError, UsageError
from raipack.stages.fuse.stage import STAGE as FUSE
from test_stages.test_fuse_sdk import install_fake_sdk

FAKES = {**fake_stages.FAKES, "fuse": dataclasses.replace(fake_stages.FAKES["fuse"], inputs=("export", "quantize"))}


def machine(tmp_path, monkeypatch, name: str) -> Path:
    """A fresh working folder and stage cache: another machine, as far as raipack can tell."""
    home = tmp_path / name
    home.mkdir()
    monkeypatch.setenv("RAIPACK_CACHE", str(home / "cache"))
    monkeypatch.chdir(home)
    return home


@pytest.fixture
def linux(tmp_path, monkeypatch):
    """Machine one: the fake stages, `raipack build --until export --handover carry`; the folder is then
    moved to another path, and the build continues on machine two with an empty cache."""
    monkeypatch.setattr(fake_stages, "CALLS", tmp_path / "calls.txt")
    monkeypatch.setattr("raipack.builder.stages.get", FAKES.__getitem__)
    machine(tmp_path, monkeypatch, "linux")
    assert run_cli(None, "build", "--until", "export", "--handover", "carry", "--name", "Tiny").code == 0
    moved = shutil.move(tmp_path / "linux" / "carry", tmp_path / "usb-stick")
    machine(tmp_path, monkeypatch, "windows")
    return Path(moved)


def calls(tmp_path) -> list[str]:
    return (tmp_path / "calls.txt").read_text().split()


def test_handover_is_self_contained_and_records_digests(linux, tmp_path):
    doc = json.loads((linux / handover.FILE).read_text())
    assert [e["stage"] for e in doc["stages"]] == ["quantize", "export"] and doc["next"] == "fuse"
    assert doc["recipe"]["name"] == "Tiny" and doc["profile"]["id"] == "1.8.0-npu-16K"
    for entry in doc["stages"]:
        folder = linux / entry["path"]
        assert folder.is_dir() and not folder.is_symlink() and not any(p.is_symlink() for p in folder.rglob("*"))
        assert entry["sha256"] == cache.folder_digest(folder) and manifest.read(folder)["complete"] is True
    assert calls(tmp_path) == ["source", "quantize", "export"]


def test_moved_handover_fuses_on_another_machine(linux, tmp_path):
    assert run_cli(None, "build", "--inputs", str(linux), "-o", "out").code == 0
    assert calls(tmp_path) == ["source", "quantize", "export", "fuse", "smoke"]  # nothing before fuse ran again
    pkg = Path("out/Tiny_rai_1.8.0_npu_16K")
    report = json.loads((pkg / "report.json").read_text())
    assert [(s["name"], s["status"]) for s in report["stages"]] == [("quantize", "carried"), ("export", "carried"), ("fuse", "built"), ("smoke", "built")]
    carried = {e["stage"]: e for e in json.loads((linux / handover.FILE).read_text())["stages"]}
    lineage = {s["name"]: s for s in manifest.read(pkg)["lineage"]["stages"]}
    for name in ("quantize", "export"):
        assert lineage[name]["carried"] is True and lineage[name]["sha256"] == carried[name]["sha256"]
        assert lineage[name]["cache_key"] == carried[name]["cache_key"] and lineage[name]["handover"] == str(linux.resolve() / handover.FILE)
    fuse_inputs = manifest.read(cache.entry("fuse", report["stages"][2]["cache_key"]))["lineage"]["inputs"]
    assert {i["stage"]: i["path"] for i in fuse_inputs} == {"export": str((linux / "export").resolve()), "quantize": str((linux / "quantize").resolve())}


def test_same_fuse_cache_key_as_a_build_on_one_machine(linux, tmp_path, monkeypatch):
    """The carried outputs' digests are the originals': the fuse stage's key is the one a whole build on the
    first machine computes, so nothing about the stage depends on where its inputs came from."""
    split = build(handover.recipe_from(handover.read(linux), None, {"output": "out"}), inputs=handover.read(linux))
    monkeypatch.setenv("RAIPACK_CACHE", str(tmp_path / "linux" / "cache"))
    monkeypatch.chdir(tmp_path / "linux")
    whole = build(load(None, {"name": "Tiny"}))
    assert split.stages[2].key == whole.stages[3].key and whole.stages[3].name == "fuse"


def test_one_edited_byte_is_refused_and_nothing_is_built(linux, tmp_path):
    data = next(p for p in sorted((linux / "export").rglob("*")) if p.is_file() and p.name != manifest.NAME)
    blob = bytearray(data.read_bytes())
    blob[len(blob) // 2] ^= 1
    data.write_bytes(bytes(blob))
    with pytest.raises(RaipackError, match=rf"the carried export output .*export was changed after the hand-over was made: {data.name} no longer has the sha256"):
        handover.read(linux)
    assert run_cli(None, "build", "--inputs", str(linux), "-o", "out").code == 1
    assert not Path("out").exists() and not (Path("cache") / "stages").exists()
    assert calls(tmp_path) == ["source", "quantize", "export"]


def test_an_edited_manifest_is_refused(linux):
    edited = linux / "quantize" / manifest.NAME
    edited.write_text(edited.read_text().replace('"complete": true', '"complete": true, "x": 1'))
    with pytest.raises(RaipackError, match=r"the carried quantize output .* does not have the digest handover.json records"):
        handover.read(linux)


def test_a_folder_without_handover_json_is_refused(linux):
    (linux / handover.FILE).unlink()
    with pytest.raises(UsageError, match=r"has no handover.json, so it is not a raipack hand-over folder"):
        handover.read(linux)
    assert run_cli(None, "build", "--inputs", str(linux)).code == 2


def test_from_a_stage_the_handover_cannot_feed_is_refused(linux):
    carried = handover.read(linux)
    with pytest.raises(UsageError, match=r"--from quantize: the hand-over in .* does not carry the output of source, which stage quantize needs"):
        build(handover.recipe_from(carried, None, {}), inputs=carried, from_="quantize")
    with pytest.raises(UsageError, match="does not carry the output of fuse, which stage smoke needs"):
        build(handover.recipe_from(carried, None, {}), inputs=carried, from_="smoke")
    with pytest.raises(UsageError, match="the hand-over carries its recipe"):
        handover.recipe_from(carried, "r.toml", {})
    with pytest.raises(UsageError, match="a profile was given"):
        handover.recipe_from(carried, None, {"profile": "1.8.0-npu-4K"})
    assert not Path("build").exists()


def test_handover_needs_a_new_folder_and_something_to_carry(tmp_path, monkeypatch):
    monkeypatch.setattr(fake_stages, "CALLS", tmp_path / "calls.txt")
    monkeypatch.setattr("raipack.builder.stages.get", FAKES.__getitem__)
    machine(tmp_path, monkeypatch, "m")
    Path("full").mkdir()
    (Path("full") / "x").write_text("x")
    assert run_cli(None, "build", "--until", "export", "--handover", "full").code == 2
    assert run_cli(None, "build", "--handover", "new/carry").code == 2  # a whole build leaves nothing to carry
    assert not Path("build").exists() and not Path("new").exists()  # refused before any stage ran
    with pytest.raises(UsageError, match="nothing to carry"):
        handover.write(Path("carry"), build(load(None, {})))
    assert not Path("carry").exists()


def test_sdk_fuse_from_a_moved_handover_gets_the_carried_export(linux, tmp_path, monkeypatch):
    calls_file = install_fake_sdk(tmp_path, monkeypatch)
    fuse = dataclasses.replace(FUSE, tools=())
    monkeypatch.setattr("raipack.builder.stages.get", {**FAKES, "fuse": fuse}.__getitem__)
    monkeypatch.setenv("FAKE_MG_PACKAGE", str(make_package(tmp_path / "amd", "1.8.0-npu-16K", name="pkg")))
    assert run_cli(None, "build", "--inputs", str(linux), "--backend", "ryzenai-sdk", "--until", "fuse", "-o", "out").code == 0
    (call,) = [json.loads(line) for line in calls_file.read_text().splitlines()]
    assert call["input_model"] == str((linux / "export").resolve()) and call["recipe"] == "token_fusion"
    pkg = Path("out/Tiny_rai_1.8.0_npu_16K")
    assert (pkg / "model.pb.bin").is_file()
    doc = manifest.read(pkg)
    assert doc["kind"] == "ryzenai-sdk-package" and {s["name"] for s in doc["lineage"]["stages"] if s.get("carried")} == {"quantize", "export"}


def test_a_changed_target_profile_is_named(linux, capsys):
    from raipack.npu.profile import get

    carried = handover.read(linux)
    assert handover.profile_drift(carried, get("1.8.0-npu-16K")) == ""
    doc = json.loads((linux / handover.FILE).read_text())
    doc["profile"]["sha256"] = "0" * 64
    (linux / handover.FILE).write_text(json.dumps(doc))
    code, _, err = run_cli(capsys, "build", "--inputs", linux, "--until", "fuse", "-o", "out")
    assert code == 0
    assert "profile 1.8.0-npu-16K here differs from the one the hand-over was made with" in err


# ------------------------------------------------------------------------- issue 24: low items

def _edit(linux: Path, change) -> None:
    path = linux / handover.FILE
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("case, expect", [
    ("unknown stage entry", r"stages\[0\]\.stage 'nonsense' is not a stage; expected one of source, "),
    ("path as a list", r"stages\[0\] path, cache_key and sha256 are not all strings"),
    ("unknown smoke option", r"recipe\.stages\.smoke: unknown option 'no_such_option'"),
    ("unknown stage table", r"recipe\.stages\.polish is not a stage"),
    ("duplicate key", r"gives the key 'next' 2 times"),
    ("deep", r"nested too deeply"),
])
def test_a_tampered_handover_json_is_one_sentence_and_nothing_is_built(linux, tmp_path, case, expect):
    """Each was accepted silently (unknown stage entry, smoke option) or a traceback (path as a list: TypeError;
    deep: RecursionError); a duplicate key made which value counts undefined."""
    path = linux / handover.FILE
    if case == "unknown stage entry":
        _edit(linux, lambda d: d["stages"][0].update(stage="nonsense"))
    elif case == "path as a list":
        _edit(linux, lambda d: d["stages"][0].update(path=["quantize"]))
    elif case == "unknown smoke option":
        _edit(linux, lambda d: d["recipe"].setdefault("stages", {}).setdefault("smoke", {}).update(no_such_option=1))
    elif case == "unknown stage table":
        _edit(linux, lambda d: d["recipe"].setdefault("stages", {}).update(polish={}))
    elif case == "duplicate key":
        path.write_text(path.read_text().rstrip()[:-1] + ', "next": "smoke"}')
    else:
        path.write_text('{"format": ' + "[" * 100000 + "]" * 100000 + "}")
    with pytest.raises(UsageError, match=expect):
        handover.read(linux)
    assert run_cli(None, "build", "--inputs", linux, "-o", "out").code == 2
    assert not Path("out").exists() and not (Path("cache") / "stages").exists()


def test_a_carried_stage_folder_that_is_a_symlink_is_refused(linux, tmp_path):
    real = tmp_path / "elsewhere"
    shutil.move(linux / "export", real)
    (linux / "export").symlink_to(real)
    with pytest.raises(UsageError, match=r"stages\[export\]\.path 'export' is not a folder inside the hand-over"):
        handover.read(linux)
