"""`raipack doctor`: the environment read truthfully (this machine, and fakes of the machines we lack),
and every package fault against it, one finding and one fix each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from factory import lfs_pointer_text
from fake_machine import fake_machine
from helpers import edit_json, run_cli
from raipack import doctor, machine
from raipack.npu.settings import INSTALL_ENV
from raipack.runtime import probes
from raipack.runtime.provider import EP_ENV, LIBRARY


@pytest.fixture
def no_provider_env(monkeypatch):
    monkeypatch.delenv(EP_ENV, raising=False)
    monkeypatch.delenv(INSTALL_ENV, raising=False)


def codes(report) -> set[str]:
    return {p.code for p in report.findings}


@pytest.fixture
def ready_machine(monkeypatch, tmp_path, no_provider_env):
    """A fake Ryzen AI 1.8.0 machine: the NPU present, OGA 0.14.0 that knows RyzenAI, a provider library that loads."""
    lib = tmp_path / "ryzenai" / LIBRARY
    lib.parent.mkdir()
    lib.write_bytes(b"")
    monkeypatch.setenv(EP_ENV, str(lib))
    versions = {"onnxruntime_genai": ("onnxruntime-genai", "0.14.0"), "onnxruntime": ("onnxruntime", "1.22.0")}
    monkeypatch.setattr(machine, "installed", lambda kind: versions[kind])
    fake_machine(monkeypatch)
    return versions


# -- this machine ---------------------------------------------------------------------------------

def test_this_machine_says_no_npu_and_no_provider(make_pkg, capsys, no_provider_env):
    """The real environment, nothing faked: no NPU, no RyzenAI provider library; exit 1, and the
    package's release and the runtime it needs are named."""
    npu_here = Path("/sys/module/amdxdna").is_dir() and any(Path("/dev/accel").glob("accel*"))
    code, out, _ = run_cli(capsys, "doctor", str(make_pkg("1.8.0-npu-16K")))
    assert code == 1
    assert ("DR001" in out) is not npu_here and ("no NPU here" in out) is not npu_here
    assert "ERROR DR005: no RyzenAI provider library found" in out and "fix:" in out
    assert "needs Ryzen AI 1.8.0" in out and "onnxruntime-genai 0.14.0" in out
    import onnxruntime_genai  # only to read its version for the comparison

    assert f"onnxruntime-genai: {onnxruntime_genai.__version__}" in out
    assert out.rstrip().endswith("error(s)") and out.rstrip().splitlines()[-1].startswith("will not run here")


def test_json_shape(capsys, no_provider_env):
    code, out, _ = run_cli(capsys, "doctor", "--format", "json")
    doc = json.loads(out)
    assert code == 1 and doc["ready"] is False and doc["package"] is None
    assert set(doc) == {"ready", "environment", "package", "findings"}
    assert {"onnxruntime_genai", "onnxruntime", "release", "ryzenai_provider", "provider_library", "npu", "sdk"} <= set(doc["environment"])
    assert doc["findings"] and all(set(f) == {"code", "severity", "message", "hint"} and f["hint"] for f in doc["findings"])
    assert "DR005" in {f["code"] for f in doc["findings"]}


@pytest.mark.parametrize("where", ["missing", "empty", "file"])
def test_no_package_there_is_exit_3(tmp_path, capsys, where):
    path = {"missing": tmp_path / "nothing", "empty": tmp_path, "file": tmp_path / "f.txt"}[where]
    if where == "file":
        path.write_text("x")
    code, out, err = run_cli(capsys, "doctor", str(path))
    assert code == 3 and out == "" and err.startswith("ERROR: ") and "hint:" in err and "Traceback" not in err


# -- a ready machine (fakes), and each package fault against it --------------------------------------

def test_a_clean_package_on_a_ready_machine_is_ready(make_pkg, ready_machine, capsys):
    code, out, _ = run_cli(capsys, "doctor", str(make_pkg("1.8.0-npu-16K")))
    assert code == 0 and "ready: this package should run here" in out and "ERROR" not in out, out


def test_a_package_of_another_release(make_pkg, ready_machine):
    ready_machine["onnxruntime_genai"] = ("onnxruntime-genai", "0.11.2")  # Ryzen AI 1.7.0's
    report = doctor.doctor(make_pkg("1.8.0-npu-16K"))
    assert not report.ready and report.environment["release"]["release"] == "1.7.0"
    (p,) = [p for p in report.findings if p.code == "DR101"]
    assert "Ryzen AI 1.8.0" in p.message and "1.7.0" in p.message and "invalid unordered_map" in p.hint


def test_a_runtime_of_no_known_release(make_pkg, ready_machine):
    ready_machine["onnxruntime_genai"] = ("onnxruntime-genai", "0.18.0")
    report = doctor.doctor(make_pkg("1.8.0-npu-16K"))
    assert {"DR003", "DR102"} <= codes(report) and report.ready  # warnings: it may still run
    assert "needs Ryzen AI 1.8.0's runtime" in next(p.message for p in report.findings if p.code == "DR102")


def _session(doc):
    return doc["model"]["decoder"]["session_options"]


@pytest.mark.parametrize("edit, code, severity, words", [
    pytest.param(lambda d: _session(d)["provider_options"][0]["RyzenAI"].update(external_data_file="C:\\models\\llama\\model.pb.bin"), "DR104", "error", "/model/decoder/session_options/provider_options/0/RyzenAI/external_data_file", id="windows path"),
    pytest.param(lambda d: d["model"]["decoder"].update(filename="/home/me/model.onnx"), "DR104", "error", "absolute or Windows-only", id="absolute path"),
    pytest.param(lambda d: _session(d).update(config_entries={"hybrid_opt_token_backend": "npu"}), "DR103", "warning", "deprecated since Ryzen AI 1.7.0", id="config_entries"),
    pytest.param(lambda d: _session(d).update(custom_ops_library="onnx_custom_ops.dll"), "DR106", "error", "'onnx_custom_ops.dll'", id="custom ops missing"),
])
def test_package_faults(make_pkg, ready_machine, edit, code, severity, words):
    pkg = make_pkg("1.8.0-npu-16K")
    edit_json(pkg / "genai_config.json", edit)
    report = doctor.doctor(pkg)
    (hit,) = [p for p in report.findings if p.code == code]
    assert hit.severity == severity and words in hit.message and hit.hint, [p.line() for p in report.findings]
    assert report.ready is (severity == "warning")  # the deprecated key alone still runs (the runtime warns)


def test_lfs_pointer_is_a_validation_error(make_pkg, ready_machine):
    pkg = make_pkg("1.8.0-npu-16K")
    (pkg / "model.bin").write_text(lfs_pointer_text(4096))
    report = doctor.doctor(pkg)
    assert not report.ready and any(p.code == "RP102" and "model.bin" in p.message for p in report.findings)


def test_prompt_limit_of_the_installed_sdk(make_pkg, ready_machine, tmp_path, monkeypatch):
    """A 16K package takes 4096-token passes; Ryzen AI 1.5.0 (the install's folder name) takes 2048."""
    install = tmp_path / "RyzenAI" / "1.5.0"
    install.mkdir(parents=True)
    monkeypatch.setenv(INSTALL_ENV, str(install))
    report = doctor.doctor(make_pkg("1.8.0-npu-16K"))
    assert report.environment["sdk"]["version"] == "1.5.0"
    (p,) = [p for p in report.findings if p.code == "DR105"]
    assert "Ryzen AI 1.5.0" in p.message and "2048" in p.message


@pytest.mark.parametrize("profile_id, words", [("reference-16K", "raipack's reference backend"), ("oga-export", "not an NPU package")])
def test_packages_amds_runtime_cannot_load(profile_id, words):
    """Judged by the detected profile (a real reference package costs a build: the profile is what counts)."""
    from raipack.npu.profile import get

    prof = get(profile_id)
    (p,) = doctor._kind_problems(prof, prof.release)
    assert p.code == "DR100" and p.severity == "error" and words in p.message
    assert doctor._kind_problems(get("1.8.0-npu-16K"), "1.8.0") == []


# -- the environment's parts, with fakes ----------------------------------------------------------

@pytest.mark.parametrize("content", [b"", b"not a shared library\n"])
def test_a_provider_library_that_does_not_load(tmp_path, monkeypatch, no_provider_env, content):
    lib = tmp_path / "sdk" / LIBRARY
    lib.parent.mkdir()
    lib.write_bytes(content)
    monkeypatch.setenv(EP_ENV, str(lib))
    env, problems = doctor.environment()
    assert env["provider_library"] == {"path": str(lib.resolve()), "loads": False, "detail": env["provider_library"]["detail"]}
    (p,) = [p for p in problems if p.code == "DR006"]
    assert str(lib.resolve()) in p.message and ("too short" in p.message or "invalid ELF header" in p.message), p.message


def test_a_library_inside_the_package_is_never_loaded(make_pkg, tmp_path, monkeypatch, no_provider_env):
    """RYZENAI_EP_PATH pointing into the package: doctor refuses it as smoke does; its constructor never runs."""
    pkg, marker = make_pkg("1.8.0-npu-16K"), tmp_path / "loaded"
    src = tmp_path / "lib.c"
    src.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void f(void) {{ FILE *o = fopen("{marker}", "w"); if (o) fclose(o); }}\n')
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(pkg / LIBRARY), str(src)], check=True)
    monkeypatch.setenv(EP_ENV, str(pkg))
    report = doctor.doctor(pkg)
    assert not marker.exists() and report.environment["provider_library"]["loads"] is None
    assert any(p.code == "DR005" and "which raipack reads as input" in p.message for p in report.findings)


def test_a_provider_library_that_loads(tmp_path):
    src = tmp_path / "lib.c"
    src.write_text("int ryzenai_fake(void) { return 1; }\n")
    lib = tmp_path / LIBRARY
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    assert probes.library_loads(lib) == (True, "")


FAKE_OGA = """class Model:
    def __init__(self, path):
        raise RuntimeError({message!r})
"""


@pytest.mark.parametrize("message, known", [
    ("Unknown provider name 'RyzenAI'. Currently supported values are 'DML'/'DmlExecutionProvider', 'CPU'", False),
    ("Failed to register RyzenAI execution provider library: Failed to load library x.so", True),
    ("something else entirely", None),
])
def test_whether_onnxruntime_genai_knows_the_provider(tmp_path, monkeypatch, message, known):
    fake = tmp_path / "fake" / "onnxruntime_genai"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_OGA.format(message=message))
    monkeypatch.setenv("PYTHONPATH", str(fake.parent))
    found, how = probes.provider_known()
    assert found is known, how
    if known is False:
        assert "Unknown provider name 'RyzenAI'" in how


def test_the_real_onnxruntime_genai_is_probed(monkeypatch):
    """The installed 0.18 knows the RyzenAI name and tries to load its library (measured)."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert probes.provider_known()[0] is True


def write_dist(site: Path, name: str, version: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_versions_come_from_metadata_never_the_current_folder(tmp_path, monkeypatch):
    site, here = tmp_path / "site", tmp_path / "here"
    write_dist(site, "onnxruntime-genai", "0.11.2")
    write_dist(here, "onnxruntime-genai", "0.9.2")  # planted in the current folder: must be ignored
    monkeypatch.chdir(here)
    monkeypatch.setattr(sys, "path", ["", str(here), str(site), *sys.path])
    assert machine.installed("onnxruntime_genai") == ("onnxruntime-genai", "0.11.2")
    assert machine.release_of("0.11.2")["release"] == "1.7.0" and machine.release_of("0.18.0") is None


def test_every_release_entry_says_where_it_comes_from():
    for entry in machine.releases()["releases"]:
        assert entry["source"] and entry["confidence"] in ("documented", "inferred", "unknown")
        assert (entry["onnxruntime_genai"] is None) is (entry["confidence"] == "unknown")


def test_linux_npu_device_from_a_fake_root(tmp_path):
    assert probes.npu_device("linux", tmp_path)["present"] is False
    (tmp_path / "sys" / "module" / "amdxdna").mkdir(parents=True)
    half = probes.npu_device("linux", tmp_path)
    assert half["present"] is False and "no /dev/accel/accel*" in half["detail"]
    (tmp_path / "dev" / "accel").mkdir(parents=True)
    (tmp_path / "dev" / "accel" / "accel0").write_text("")
    full = probes.npu_device("linux", tmp_path)
    assert full["present"] is True and "/dev/accel/accel0" in full["detail"]


@pytest.mark.parametrize("stdout, present, driver", [("32.0.203.240\r\n", True, "32.0.203.240"), ("", False, None)])
def test_windows_npu_driver_with_a_fake_powershell(stdout, present, driver):
    calls = []

    def runner(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout, "")

    npu = probes.npu_device("win32", runner=runner)
    assert npu["present"] is present and npu["driver"] == driver and calls[0][0] == "powershell"
    problems = doctor._npu_problems(npu)
    assert [p.code for p in problems] == (["DR007"] if present else ["DR001"])  # .240 is older than .280


# -- the NPU device and driver against the package's release (catalog: devices, driver_minimum) -----

def _pci(root: Path, slot: str, vendor: str, device: str) -> None:
    folder = root / "sys" / "bus" / "pci" / "devices" / slot
    folder.mkdir(parents=True)
    (folder / "vendor").write_text(vendor + "\n")
    (folder / "device").write_text(device + "\n")


def test_linux_npu_pci_device_from_a_fake_root(tmp_path):
    _pci(tmp_path, "0000:00:08.0", "0x1022", "0x14ea")  # an AMD bridge: not an NPU
    _pci(tmp_path, "0000:c5:00.1", "0x1022", "0x17f0")
    assert probes.npu_device("linux", tmp_path)["device"] == "DEV_17F0"
    assert "PCI device DEV_17F0" in probes.npu_device("linux", tmp_path)["detail"]


def test_windows_npu_device_and_the_newer_driver_format(monkeypatch):
    def runner(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 0, "32.0.20101.3760\r\nPCI\\VEN_1022&DEV_1502&SUBSYS_0C4F1028&REV_00\r\n", "")

    npu = probes.npu_device("win32", runner=runner)
    assert npu == {"present": True, "driver": "32.0.20101.3760", "device": "DEV_1502",
                   "detail": "NPU driver 32.0.20101.3760, PCI device DEV_1502 (Win32_PnPSignedDriver)"}


@pytest.mark.parametrize("release, npu, expected", [
    ("1.8.0", {"device": "DEV_17F0", "driver": "32.0.20101.3760"}, []),  # the new format is newer than 32.0.203.280 (lemonade #3492)
    ("1.8.0", {"device": "DEV_17F0", "driver": "32.0.203.280"}, []),
    ("1.8.0", {"device": "DEV_1502", "driver": "32.0.20101.3760"}, [("DR108", "error")]),  # XDNA1: no LLM packages
    ("1.8.0", {"device": "DEV_2000", "driver": "32.0.203.280"}, [("DR108", "warning")]),  # a device the catalog does not list
    ("1.6.0", {"device": "DEV_17F0", "driver": "32.0.203.257"}, [("DR109", "error")]),  # 1.6's minimum is documented
    ("1.8.0", {"device": "DEV_17F0", "driver": "32.0.203.257"}, [("DR109", "warning")]),  # 1.8.0's is inferred from 1.7
    ("1.8.0", {"device": None, "driver": "2.19.0"}, []),  # Linux amdxdna versions are not Windows driver versions
    ("n/a", {"device": "DEV_1502", "driver": "1.0.0.0"}, []),
])
def test_device_and_driver_against_the_release(release, npu, expected):
    problems = doctor.device_problems(release, {"present": True, **npu})
    assert [(p.code, p.severity) for p in problems] == expected
    for p in problems:
        assert f"Ryzen AI {release}" in p.message and (npu["device"] in p.message or npu["driver"] in p.message)


def test_a_package_on_an_xdna1_machine_will_not_run(make_pkg, ready_machine, monkeypatch, capsys):
    monkeypatch.setattr(probes, "npu_device", lambda: {"present": True, "driver": "32.0.20101.3760", "device": "DEV_1502", "detail": "fake XDNA1 NPU"})
    code, out, _ = run_cli(capsys, "doctor", make_pkg("1.8.0-npu-16K"))
    assert code == 1 and "ERROR DR108" in out and "DEV_1502 (XDNA1" in out and "DEV_17F0 (XDNA2" in out, out
