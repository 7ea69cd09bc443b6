"""The smoke stage's NPU attempt and the fuse stage's ryzenai-sdk backend, with real errors and fakes."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
import types
from pathlib import Path

import pytest

from fake_machine import fake_machine, fake_oga
from helpers import edit_json
from raipack.core.errors import RaipackError
from raipack.npu.settings import INSTALL_ENV
from raipack.runtime import probes
from raipack.runtime.provider import EP_ENV, LIBRARY, find_provider_library
from raipack.stages.fuse import sdk
from raipack.stages.fuse.stage import choose_backend
from raipack.stages.smoke.npu import generate, try_npu
from raipack.stages.smoke.stage import _problems
from raipack.validate import validate

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


LIBRARY_SOURCE = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void loaded(void) {
    char cwd[4096] = "";
    FILE *f = fopen(MARKER, "w");
    if (f) { fputs(getcwd(cwd, sizeof cwd) ? cwd : "?", f); fclose(f); }
}
"""


def provider_library(folder, marker):
    """A shared library named like the RyzenAI provider whose constructor writes its working folder to `marker`."""
    folder.mkdir(parents=True, exist_ok=True)
    src = folder.parent / f"{folder.name}-lib.c"
    src.write_text(LIBRARY_SOURCE)
    lib = folder / LIBRARY
    subprocess.run(["gcc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(lib), str(src)], check=True)
    return lib


real_loads = probes.library_loads


@pytest.fixture
def no_provider_env(monkeypatch):
    monkeypatch.delenv(EP_ENV, raising=False)
    monkeypatch.delenv(INSTALL_ENV, raising=False)


def test_library_in_the_current_folder_is_never_loaded(make_pkg, tmp_path):
    """The attack: `cd MODEL && raipack build .` with MODEL holding libonnxruntime_providers_ryzenai.so.
    onnxruntime-genai falls back to the current folder when RYZENAI_EP_PATH is unset; raipack never lets it."""
    pkg = make_pkg("1.8.0-npu-16K")
    model, marker = tmp_path / "model", tmp_path / "loaded"
    provider_library(model, marker)
    env = {k: v for k, v in os.environ.items() if k not in (EP_ENV, INSTALL_ENV)}
    code = f"from raipack.stages.smoke.npu import try_npu; print(try_npu({str(pkg)!r}, [[1, 2, 3]], 4).reason)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=model, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists(), f"the library in the current folder was loaded (its constructor ran in {marker.read_text()})"
    reason = proc.stdout.strip()
    assert reason.startswith("no RyzenAI provider library found") and f"{EP_ENV} is not set" in reason, reason


def test_a_library_the_user_chose_is_tried_from_an_empty_folder(make_pkg, tmp_path, monkeypatch, no_provider_env):
    """With RYZENAI_EP_PATH naming a folder outside the inputs, onnxruntime-genai really loads that library
    (its constructor runs, then the provider registration fails in OGA's own words), in a child process
    whose working folder is a fresh empty one, removed afterwards."""
    pkg = make_pkg("1.8.0-npu-16K")
    marker = tmp_path / "loaded"
    lib = provider_library(tmp_path / "sdk" / "lib", marker)
    monkeypatch.setenv(EP_ENV, str(lib.parent))
    fake_machine(monkeypatch)  # the NPU and OGA's provider probe, which this machine lacks; the library's loading is real
    monkeypatch.setattr(probes, "library_loads", real_loads)
    attempt = try_npu(pkg, [[1, 2, 3]], 4)
    assert attempt.ok is False and attempt.tokens == []
    assert "Failed to register RyzenAI execution provider library" in attempt.reason and str(lib) in attempt.reason
    assert "\n" not in attempt.reason and len(attempt.reason) <= 800
    cwd = Path(marker.read_text())
    assert cwd.name.startswith("raipack-npu-") and cwd != Path.cwd() and not cwd.exists()


def test_the_installed_sdk_is_found(tmp_path, no_provider_env, monkeypatch):
    lib = tmp_path / "RyzenAI" / "1.8.0" / "lib" / LIBRARY
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    monkeypatch.setenv(INSTALL_ENV, str(tmp_path / "RyzenAI" / "1.8.0"))
    assert find_provider_library() == (lib.resolve(), "")
    lib.unlink()
    found, why = find_provider_library()
    assert found is None and why.startswith("no RyzenAI provider library found") and str(lib) in why


@pytest.mark.parametrize("where", ["package", "model", "cwd", "relative"])
def test_a_library_from_the_inputs_or_the_current_folder_is_refused(make_pkg, tmp_path, monkeypatch, no_provider_env, where):
    pkg = make_pkg("1.8.0-npu-16K")
    model, here, marker = tmp_path / "model", tmp_path / "here", tmp_path / "loaded"
    folder = {"package": pkg / "lib", "model": model, "cwd": here, "relative": here}[where]
    provider_library(folder, marker)
    here.mkdir(exist_ok=True)
    monkeypatch.chdir(here)
    monkeypatch.setenv(EP_ENV, "." if where == "relative" else str(folder))
    attempt = try_npu(pkg, [[1, 2, 3]], 4, untrusted=[model])
    assert not marker.exists()
    expected = {"package": "which raipack reads as input", "model": "which raipack reads as input", "cwd": "in the current folder", "relative": "not an absolute path"}[where]
    assert attempt.ok is False and EP_ENV in attempt.reason and expected in attempt.reason, attempt.reason


def test_a_library_the_package_names_is_refused(make_pkg, tmp_path, monkeypatch, no_provider_env):
    """genai_config.json's custom_ops_library would make onnxruntime-genai dlopen a file of the package."""
    pkg = make_pkg("1.8.0-npu-16K")
    package_marker, user_marker = tmp_path / "package-lib-loaded", tmp_path / "user-lib-loaded"
    provider_library(pkg / "ops", package_marker).rename(pkg / "ops" / "custom_ops.so")
    monkeypatch.setenv(EP_ENV, str(provider_library(tmp_path / "sdk", user_marker)))
    edit_json(pkg / "genai_config.json", lambda d: d["model"]["decoder"]["session_options"].update(custom_ops_library="ops/custom_ops.so"))
    attempt = try_npu(pkg, [[1, 2, 3]], 4)
    assert not package_marker.exists() and not user_marker.exists()
    assert attempt.ok is False and "custom_ops_library" in attempt.reason, attempt.reason


def fake_og(tokens, device="RyzenAI", log=()):
    """A stand-in onnxruntime_genai whose Model loads on `device` (None: a runtime without
    Model.device_type), logs `log` through its log callback, and whose generator yields `tokens`."""
    mod = types.ModuleType("onnxruntime_genai")
    mod.callbacks = []

    class Model:
        def __init__(self, path):
            self.path = path
            for line in log:
                mod.callbacks[-1](line)

    if device is not None:
        Model.device_type = property(lambda self: device)
    mod.set_log_options = lambda **kw: None
    mod.set_log_callback = mod.callbacks.append

    class GeneratorParams:
        def __init__(self, model):
            self.options = {}

        def set_search_options(self, **kw):
            self.options.update(kw)

    class Generator:
        def __init__(self, model, params):
            self.left = list(tokens)
            self.last = None

        def append_tokens(self, ids):
            self.prompt = list(ids)

        def is_done(self):
            return not self.left

        def generate_next_token(self):
            self.last = self.left.pop(0)

        def get_next_tokens(self):
            return [self.last]

    mod.Model, mod.GeneratorParams, mod.Generator = Model, GeneratorParams, Generator
    return mod


def test_npu_path_wiring_with_a_fake_runtime(tmp_path):
    og = fake_og([5, 6, 7])
    attempt = generate(og, tmp_path, [[1, 2], [3]], 2)
    assert attempt.ok and attempt.tokens == [[5, 6], [5, 6]]
    assert "RyzenAI" in attempt.reason
    assert og.callbacks[-1] is None  # the log callback is removed again (OGA aborts at exit otherwise)


@pytest.mark.parametrize("device, log, expected", [
    ("CPU", (), "ran on the CPU: og.Model.device_type is 'CPU'"),
    ("DML", (), "ran on the DML device"),
    (None, (), "cannot be confirmed"),
    ("RyzenAI", ("[W] No RyzenAI devices detected",), "ran on the CPU: onnxruntime-genai logged '[W] No RyzenAI devices detected'"),
])
def test_a_model_that_loads_but_falls_back_is_no_npu_run(tmp_path, device, log, expected):
    """The silent CPU fallback: the model loads with the RyzenAI block and would generate, yet the
    runtime's device query or its log says the provider did not run it."""
    attempt = generate(fake_og([5, 6, 7], device=device, log=log), tmp_path, [[1, 2]], 2)
    assert attempt.ok is False and attempt.tokens == [] and expected in attempt.reason, attempt.reason


@pytest.mark.parametrize("mode", ["cpu", "stderr", "ryzenai"])
def test_the_child_process_reports_a_fallback(make_pkg, tmp_path, monkeypatch, no_provider_env, mode):
    """try_npu end to end with a fake onnxruntime_genai on the child's PYTHONPATH (a tmp folder, never
    the current one): a CPU device or a fallback line on stderr is ok=False naming it; RyzenAI is ok."""
    lib = tmp_path / "sdk" / LIBRARY
    lib.parent.mkdir()
    lib.write_bytes(b"")  # found, never loaded: the fake runtime loads nothing
    monkeypatch.setenv(EP_ENV, str(lib))
    monkeypatch.setenv("PYTHONPATH", str(fake_oga(tmp_path, mode)))
    fake_machine(monkeypatch)  # an NPU, a library that loads, an OGA that knows RyzenAI: the child's fake runtime does the rest
    attempt = try_npu(make_pkg("1.8.0-npu-16K"), [[1, 2, 3]], 3)
    if mode == "ryzenai":
        assert attempt.ok and attempt.tokens == [[41, 42, 43]] and "'RyzenAI'" in attempt.reason, attempt.reason
    else:
        assert attempt.ok is False and attempt.tokens == [] and "ran on the CPU" in attempt.reason, attempt.reason
        assert {"cpu": "device_type is 'CPU'", "stderr": "Falling back to CPU execution provider"}[mode] in attempt.reason


def test_smoke_problems_name_what_failed():
    good = {"finite": True, "tokens_match_export": True, "tiers": [{"tier": 128, "finite": True, "tokens_match_export": True}], "overlong_prompt_refused": True, "answer": "The capital of France is Paris."}
    assert _problems(good, "Paris") == []
    bad = dict(good, finite=False, tokens_match_export=False, overlong_prompt_refused=False, answer="Lyon")
    probs = _problems(bad, "Paris")
    assert len(probs) == 4 and any("NaN" in p for p in probs) and any("'Paris'" in p for p in probs)


FAKE_TOOL = """import sys
from pathlib import Path
from factory import make_package
args = sys.argv[1:]
if {fail!r}:
    print("model_generate: unsupported operator pattern in layer 3", file=sys.stderr)
    sys.exit(4)
out, src = Path(args[1]), Path(args[2])
tmp = out.parent / (".fake-" + out.name)
pkg = make_package(tmp, "1.8.0-npu-16K", name="p")
for item in pkg.iterdir():
    item.rename(out / item.name)
(out / "args.txt").write_text(" ".join(args))
"""


def fake_tool(tmp_path, fail=False):
    """An executable `model_generate` that runs FAKE_TOOL with tests/ on its import path."""
    script = tmp_path / "model_generate.py"
    script.write_text(FAKE_TOOL.format(fail=fail))
    path = tmp_path / "model_generate"
    path.write_text(f'#!/bin/sh\nPYTHONPATH={shlex.quote(TESTS)} exec {shlex.quote(sys.executable)} {shlex.quote(str(script))} "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_auto_backend_says_which_ran_and_why(tmp_path, monkeypatch):
    monkeypatch.delenv("RAIPACK_MODEL_GENERATE", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    backend, why = choose_backend("auto")
    assert backend == "reference" and "not installed" in why
    monkeypatch.setenv("RAIPACK_MODEL_GENERATE", str(fake_tool(tmp_path)))
    backend, why = choose_backend("auto")
    assert backend == "ryzenai-sdk" and str(tmp_path) in why


def test_sdk_backend_contract_with_a_fake_model_generate(tmp_path, monkeypatch):
    from raipack.npu.profile import get

    monkeypatch.setenv("RAIPACK_MODEL_GENERATE", str(fake_tool(tmp_path)))
    out = tmp_path / "out"
    out.mkdir()
    report = sdk.generate(get("1.8.0-npu-16K"), tmp_path / "export", out)
    assert report["backend"] == "ryzenai-sdk"
    assert (out / "args.txt").read_text().split()[:1] == ["--npu"]
    assert "--token_fusion" in report["command"] and "max_seq_len=16384" in report["command"]
    (out / "args.txt").unlink()
    result = validate(out, "1.8.0-npu-16K")
    assert not result.failed(), [f.message for f in result.findings]


def test_sdk_backend_failure_is_one_sentence(tmp_path, monkeypatch):
    from raipack.npu.profile import get

    monkeypatch.setenv("RAIPACK_MODEL_GENERATE", str(fake_tool(tmp_path, fail=True)))
    with pytest.raises(RaipackError, match="model_generate failed: model_generate: unsupported operator pattern in layer 3"):
        sdk.generate(get("1.8.0-npu-4K"), tmp_path, tmp_path / "o")
    monkeypatch.setenv("RAIPACK_MODEL_GENERATE", str(tmp_path / "missing"))
    with pytest.raises(RaipackError, match="not installed"):
        sdk.generate(get("1.8.0-npu-4K"), tmp_path, tmp_path / "o")


def test_smoke_runs_the_tiers_up_to_1024_and_the_largest_once():
    from raipack.npu import profile as profiles
    from raipack.stages.smoke.stage import prompt_lengths

    tiers = list(profiles.get("1.8.0-npu-16K").buckets.prefill)  # 1 ... 4096
    every = prompt_lengths(tiers, 4096, 4096, 4)
    scaled = prompt_lengths(tiers, 4096, 4096, 4, all_up_to=1024)
    assert [t for t, _ in every] == tiers
    assert [t for t, _ in scaled] == [1, 128, 256, 512, 768, 1024, 4096]
    # the largest tier's prompt is its shortest, one above the tier below it (3072): the package pays for the padded
    # tier anyway, the export's check for the prompt; the others are their tier's longest but three
    assert scaled[-1] == every[-1] == (4096, 3073)
    assert scaled[:-1] == every[:6] == [(1, 1), (128, 125), (256, 253), (512, 509), (768, 765), (1024, 1021)]
    assert prompt_lengths(tiers, 4096, 1024, 4, all_up_to=1024) == [*every[:5], (1024, 769)]  # max_tier 1024: its largest is 1024
    assert prompt_lengths([], 4096, 4096, 4, all_up_to=1024) == [(4096, 4092)]  # no tiers (hybrid): one prompt, as before


def test_smoke_tiers_is_a_recipe_key_checked_by_the_schema():
    from raipack.builder.recipe import RecipeError, load

    assert load(None, {"smoke.tiers": "all"}).stages["smoke"] == {"tiers": "all"}
    with pytest.raises(RecipeError, match="tiers"):
        load(None, {"smoke.tiers": "some"})
