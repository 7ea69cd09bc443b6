"""Issue 37, item 5: a package that ships its own shared library is not ok. A 1.8 package whose
genai_config names `libevil.so` inside it as `custom_ops_library` got no finding from `validate --strict`
(RP106 exempted the named library) and `lemonade register` registered it; onnxruntime-genai would load it
with the model. Now any shared library in a package, by name or by its first bytes, is RP113's error, and
register and publish refuse the package."""

from __future__ import annotations

import json
import shutil
import struct

import pytest

from factory import make_package
from helpers import run_cli
from planted import compile_library
from raipack.validate import validate


@pytest.fixture(scope="module")
def evil_pkg(tmp_path_factory):
    """The issue's package: a 1.8 NPU package naming its own libevil.so as custom_ops_library."""
    root = tmp_path_factory.mktemp("evil")
    pkg = make_package(root, "1.8.0-npu-16K")
    compile_library(pkg / "libevil.so", root / "MARKER")
    config = json.loads((pkg / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"]["custom_ops_library"] = "libevil.so"
    (pkg / "genai_config.json").write_text(json.dumps(config, indent=2))
    return pkg


def rp113(pkg, **kw):
    return [f for f in validate(pkg, **kw).findings if f.check_id == "RP113"]


def test_the_named_library_is_an_error(evil_pkg):
    result = validate(evil_pkg)
    (finding,) = [f for f in result.findings if f.check_id == "RP113"]
    assert (finding.severity, finding.path) == ("error", "libevil.so")
    assert "shared library" in finding.message and "custom_ops_library" in finding.message and "Ryzen AI install" in finding.hint
    assert result.failed()
    assert not (evil_pkg.parent / "MARKER").exists()  # validating never loads it


def test_validate_command_fails_on_it(evil_pkg):
    ran = run_cli(None, "validate", evil_pkg, "--strict")
    assert ran.code == 1 and "RP113" in ran.out and "libevil.so" in ran.out


def test_lemonade_register_refuses_it(evil_pkg, tmp_path):
    conf = tmp_path / "lemonade"
    ran = run_cli(None, "lemonade", "register", evil_pkg, "--config-dir", conf)
    assert ran.code == 1 and "RP113" in ran.err and "libevil.so" in ran.err
    assert not (conf / "user_models.json").exists()


def test_publish_refuses_it(evil_pkg):
    ran = run_cli(None, "publish", evil_pkg, "--dry-run", "--repo", "me/pkg")
    assert ran.code == 1 and "RP113" in ran.out + ran.err and "libevil.so" in ran.out + ran.err


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return make_package(tmp_path_factory.mktemp("clean"), "1.8.0-npu-16K")


def with_file(clean, tmp_path, rel, data):
    pkg = tmp_path / clean.name
    shutil.copytree(clean, pkg)
    (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
    (pkg / rel).write_bytes(data)
    return pkg


def pe_bytes():
    head = bytearray(b"MZ" + bytes(126))
    head[0x3C:0x40] = struct.pack("<I", 0x80)
    return bytes(head) + b"PE\0\0" + bytes(64)


@pytest.mark.parametrize("rel, data, kind", [
    ("cache/weights.dat", b"\x7fELF\x02\x01\x01" + bytes(100), "ELF"),
    ("notes.txt", pe_bytes(), "PE"),
    ("extra/model.bin.bak", bytes.fromhex("cffaedfe") + bytes(60), "Mach-O"),
    ("fat", bytes.fromhex("cafebabe") + struct.pack(">I", 2) + bytes(40), "Mach-O"),
    ("deployment/lib/libonnx_custom_ops.so.1", b"text, but named as a library", "named *.so.*"),
    ("ONNX_CUSTOM_OPS.DLL", b"x", "named *.dll"),
], ids=["elf", "pe", "mach-o", "fat-mach-o", "versioned-so", "upper-case-dll"])
def test_a_library_is_known_by_its_bytes_or_its_name(clean, tmp_path, rel, data, kind):
    pkg = with_file(clean, tmp_path, rel, data)
    (finding,) = rp113(pkg)
    assert (finding.severity, finding.path) == ("error", rel) and f"({kind})" in finding.message
    assert "custom_ops_library" not in finding.message  # no config names it


@pytest.mark.parametrize("rel, data", [
    ("notes.txt", b"MZ is how this note starts, and nothing more" + bytes(100)),  # MZ without a PE header
    ("Main.class", bytes.fromhex("cafebabe") + struct.pack(">HH", 0, 52) + bytes(40)),  # a Java class, version 52
    ("tiny", b"\x7fE"),
], ids=["mz-text", "java-class", "short"])
def test_files_that_only_look_alike_are_not_libraries(clean, tmp_path, rel, data):
    assert rp113(with_file(clean, tmp_path, rel, data)) == []


def test_python_code_stays_a_warning_of_rp106(clean, tmp_path):
    pkg = with_file(clean, tmp_path, "helper.py", b"print('hi')\n")
    assert [(f.check_id, f.severity) for f in validate(pkg).findings if f.path == "helper.py"] == [("RP106", "warning")]


def test_external_data_is_read_only_when_a_config_names_it_as_the_library(clean, tmp_path):
    """validate never opens model.onnx.data (its size is all RP702 needs): a library hidden there is found
    when genai_config.json names it as custom_ops_library, the one way a runtime would load it."""
    pkg = tmp_path / clean.name
    shutil.copytree(clean, pkg)
    data = pkg / "model.onnx.data"
    with open(data, "r+b") as fh:
        fh.write(b"\x7fELF\x02\x01\x01")
    assert rp113(pkg) == []
    config = json.loads((pkg / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"]["custom_ops_library"] = "./model.onnx.data"
    (pkg / "genai_config.json").write_text(json.dumps(config))
    (finding,) = rp113(pkg)
    assert (finding.severity, finding.path) == ("error", "model.onnx.data") and "(ELF)" in finding.message and "custom_ops_library" in finding.message
