"""Issue 37, item 11 and three of its low items: a file raipack wrote that its manifest does not list
fails `--verify-hashes`; an NPU header whose weights file is a folder fails validate; the files raipack
writes are readable by other accounts (0666 less the umask, as a plain write); `bench --numerics`
with no name in it is a usage error."""

from __future__ import annotations

import json
import os
import shutil
import stat

import pytest

from amd_header import header_bytes
from factory import make_package, write_manifest
from helpers import run_cli
from raipack.core import lfs, manifest
from raipack.core.output import atomic_write_bytes, atomic_write_text
from raipack.validate import validate


@pytest.fixture(scope="module")
def clean16(tmp_path_factory):
    return make_package(tmp_path_factory.mktemp("p16"), "1.8.0-npu-16K")


def copy(src, tmp_path):
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------------ item 11: --verify-hashes and unlisted files

def drop_from_manifest(pkg, rel):
    doc = json.loads((pkg / "manifest.json").read_text())
    doc["files"] = [e for e in doc["files"] if e["path"] != rel]
    (pkg / "manifest.json").write_text(json.dumps(doc, indent=2))


def test_a_const_dropped_from_raipack_manifest_then_changed_fails_verify_hashes(clean16, tmp_path):
    """The issue's reproduction: the entry of a runtime file removed from manifest.json, then the file changed
    (same size): a warning only, and exit 0, on b938a75; an RP802 error now."""
    pkg = copy(clean16, tmp_path)
    write_manifest(pkg)
    const = "cache/MatMulNBits_0_0_wts.const"
    rp802 = [f for f in validate(pkg, verify_hashes=True).findings if f.check_id == "RP802"]
    assert rp802 == []
    drop_from_manifest(pkg, const)
    data = bytearray((pkg / const).read_bytes())
    data[0] ^= 0xFF
    (pkg / const).write_bytes(bytes(data))
    result = validate(pkg, verify_hashes=True)
    hits = [(f.check_id, f.severity, f.path) for f in result.findings if f.path == const]
    assert ("RP802", "error", const) in hits and ("RP801", "warning", const) in hits
    (finding,) = [f for f in result.findings if f.check_id == "RP802"]
    assert "has no sha256 in manifest.json" in finding.message and finding.hint
    assert result.failed()
    ran = run_cli(None, "validate", pkg, "--verify-hashes")
    assert ran.code == 1 and "RP802" in ran.out and const in ran.out


def test_a_file_added_to_a_raipack_folder_fails_verify_hashes_and_only_warns_without(clean16, tmp_path):
    pkg = copy(clean16, tmp_path)
    write_manifest(pkg)
    (pkg / "notes.txt").write_text("added after the build\n")
    assert [(f.check_id, f.severity) for f in validate(pkg).findings if f.path == "notes.txt"] == [("RP801", "warning")]
    hits = [(f.check_id, f.severity) for f in validate(pkg, verify_hashes=True).findings if f.path == "notes.txt"]
    assert ("RP802", "error") in hits


def test_a_manifest_not_written_by_raipack_leaves_unlisted_files_to_the_lfs_oids(clean16, tmp_path):
    """A manifest.json of another tool is no promise that every file is listed: no RP802 error for an unlisted file."""
    pkg = copy(clean16, tmp_path)
    write_manifest(pkg)
    doc = json.loads((pkg / "manifest.json").read_text())
    doc["generator"] = {"name": "someone-else"}
    (pkg / "manifest.json").write_text(json.dumps(doc))
    (pkg / "notes.txt").write_text("x\n")
    assert [f for f in validate(pkg, verify_hashes=True).findings if f.check_id == "RP802" and f.severity == "error"] == []


# ------------------------------------------------------------------ low: a header whose weights file is a folder

@pytest.mark.parametrize("profile, header", [("1.8.0-npu-16K", "model.pb.bin"), ("1.6-npu", "prefill.pb.bin")])
def test_a_header_naming_a_folder_as_its_weights_file_is_an_error(tmp_path, profile, header):
    pkg = make_package(tmp_path, profile)
    (pkg / "other.bin").mkdir()
    (pkg / "other.bin" / "x").write_bytes(b"1" * 100)
    (pkg / header).write_bytes(header_bytes("other.bin", [("layers.0.mlp", 0, 10)]))
    result = validate(pkg)
    (finding,) = [f for f in result.findings if f.severity == "error"]
    assert (finding.check_id, finding.path) == ("RP112", header)
    assert "other.bin, which is a folder" in finding.message and finding.pointer == "/external_data/filename"
    assert result.failed()


# ------------------------------------------------------------------ low: files raipack writes are not private

@pytest.fixture
def umask():
    def set_(mask):
        os.umask(mask)
    old = os.umask(0o022)
    yield set_
    os.umask(old)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_atomic_writes_get_the_mode_a_plain_write_gets(tmp_path, umask, mask):
    umask(mask)
    atomic_write_text(tmp_path / "report.json", "{}\n")
    (tmp_path / "plain.json").write_text("{}\n")
    assert mode(tmp_path / "report.json") == mode(tmp_path / "plain.json") == 0o666 & ~mask


def test_manifest_report_and_gitattributes_are_readable_by_others(clean16, tmp_path, umask):
    """manifest.json, .gitattributes and validate's report.json (report.html is written by the same
    atomic_write_text) were 0600, mkstemp's mode, so another account's validate failed on them."""
    umask(0o022)
    pkg = copy(clean16, tmp_path)
    manifest.write(pkg, "package")
    lfs.write(pkg)
    ran = run_cli(None, "validate", pkg, "--format", "json", "-o", tmp_path / "report.json")
    assert ran.code in (0, 1)
    for path in (pkg / "manifest.json", pkg / ".gitattributes", tmp_path / "report.json"):
        assert mode(path) == 0o644, path


def test_replacing_a_file_keeps_its_mode(tmp_path, umask):
    """`like`: a file edited in place keeps its own mode, not the umask's."""
    umask(0o022)
    target = tmp_path / "genai_config.json"
    target.write_text("{}")
    os.chmod(target, 0o600)
    atomic_write_bytes(target, b"{ }", like=os.stat(target))
    assert mode(target) == 0o600


# ------------------------------------------------------------------ low: bench --numerics with an empty name

@pytest.mark.parametrize("value", ["", ",,,", "float,", " , bfp16"])
def test_bench_numerics_without_a_name_is_a_usage_error(clean16, value):
    ran = run_cli(None, "bench", clean16, "--numerics", value)
    assert ran.code == 2
    assert f"--numerics is {value!r}, which has an empty name" in ran.err and "hint:" in ran.err
    assert "Traceback" not in ran.err and "measuring" not in ran.err
