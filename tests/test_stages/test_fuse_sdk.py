"""The ryzenai-sdk fuse backend through model_generate's Python API, with a fake `model_generate` package.

The fake has generate_model's exact signature (as Olive's RyzenGenerateModelLLM pass calls it), records
each call as a JSON line and writes a package folder (a copy of a factory package of the target), or
raises, or crashes, or leaves files out. It lives in a tmp folder put on sys.path, never the cwd."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

import fake_stages
from factory import make_package
from raipack.builder import cache
from raipack.builder.recipe import load
from raipack.builder.runner import StageFailed, build
from raipack.core.errors import RaipackError, UsageError
from raipack.npu.profile import get
from raipack.stages.fuse import sdk
from raipack.stages.fuse.stage import STAGE as FUSE
from raipack.stages.fuse.stage import FuseConfig, choose_backend, preflight

FAKE_MODULE = '''
import json, os, shutil
from pathlib import Path


def generate_model(mode, output_dir, input_model, recipe=None, mem_optimize=False, model_name=None,
                   output_model_name=None, extra_options=None, verbose=0):
    call = {"mode": mode, "output_dir": output_dir, "input_model": input_model, "recipe": recipe,
            "mem_optimize": mem_optimize, "model_name": model_name, "output_model_name": output_model_name,
            "extra_options": extra_options, "verbose": verbose, "cwd": os.getcwd()}
    with open(os.environ["FAKE_MG_CALLS"], "a") as fh:
        fh.write(json.dumps(call) + "\\n")
    how = os.environ.get("FAKE_MG_HOW", "ok")
    if how == "raise":
        raise RuntimeError("unsupported operator pattern in layer 3\\nTraceback details the user never sees")
    if how == "crash":
        os.abort()
    src = os.environ.get("FAKE_MG_PACKAGE")
    if src:
        shutil.copytree(src, output_dir, dirs_exist_ok=True)
    for pattern in filter(None, os.environ.get("FAKE_MG_DROP", "").split(",")):
        for path in Path(output_dir).glob(pattern):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
'''


def install_fake_sdk(tmp_path, monkeypatch) -> Path:
    """Put a fake model_generate package on sys.path (its folder is not the cwd, no executable on PATH);
    return the file its calls are recorded in."""
    root = tmp_path / "site"
    (root / "model_generate").mkdir(parents=True)
    (root / "model_generate" / "__init__.py").write_text(FAKE_MODULE)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("FAKE_MG_CALLS", str(calls))
    monkeypatch.delenv("RAIPACK_MODEL_GENERATE", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    return calls


@pytest.fixture
def fake_sdk(tmp_path, monkeypatch):
    """The fake model_generate, the test running in an empty folder of its own."""
    calls = install_fake_sdk(tmp_path, monkeypatch)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return calls


def recorded(calls: Path) -> list[dict]:
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def run_generate(tmp_path, profile_id, config=None):
    export, out = tmp_path / "export", tmp_path / f"out-{profile_id}"
    export.mkdir(exist_ok=True)
    out.mkdir()
    return sdk.generate(get(profile_id), export, out, config), export, out


@pytest.mark.parametrize("profile_id, mode, recipe, extra", [
    ("1.8.0-npu-4K", "npu", "full_fusion", {}),
    ("1.8.0-npu-16K", "npu", "token_fusion", {"max_seq_len": "16384"}),
    ("1.7.1-npu-16K", "npu", "token_fusion", {"max_seq_len": "16384"}),
    ("1.8.0-hybrid", "hybrid", None, {}),
])
def test_the_call_per_target(fake_sdk, tmp_path, profile_id, mode, recipe, extra):
    report, export, out = run_generate(tmp_path, profile_id)
    (call,) = recorded(fake_sdk)
    assert (call["mode"], call["recipe"], call["extra_options"]) == (mode, recipe, extra)
    assert call["input_model"] == str(export) and call["output_dir"] == str(out)
    assert call["mem_optimize"] is False and call["model_name"] is None and call["output_model_name"] is None
    assert Path(call["cwd"]) != Path.cwd() and not Path(call["cwd"]).exists()  # a fresh folder, gone after the call
    assert report["sdk"]["via"] == "python" and report["sdk"]["module_path"] == str((tmp_path / "site" / "model_generate" / "__init__.py").resolve())
    assert (report["sdk"]["mode"], report["sdk"]["recipe"]) == (mode, recipe) and report["sdk"]["version"] == "not installed"


def test_max_seq_len_is_the_profile_context():
    for pid in ("1.7.1-npu-16K", "1.8.0-npu-16K"):
        assert get(pid).sdk.extra_options["max_seq_len"] == str(get(pid).context)


def test_recipe_overrides_reach_the_call(fake_sdk, tmp_path):
    cfg = FuseConfig(backend="ryzenai-sdk", recipe="basic", mem_optimize=True, extra_options={"model_type": "llama"})
    run_generate(tmp_path, "1.8.0-npu-16K", cfg)
    (call,) = recorded(fake_sdk)
    assert call["recipe"] == "basic" and call["mem_optimize"] is True
    assert call["extra_options"] == {"max_seq_len": "16384", "model_type": "llama"}


def test_a_raise_is_one_sentence(fake_sdk, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MG_HOW", "raise")
    with pytest.raises(RaipackError) as err:
        run_generate(tmp_path, "1.8.0-npu-4K")
    assert str(err.value) == "model_generate failed: RuntimeError: unsupported operator pattern in layer 3"
    assert "log" in err.value.hint


def test_a_crash_is_one_sentence_not_the_end_of_the_build(fake_sdk, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MG_HOW", "crash")
    with pytest.raises(RaipackError, match=r"^model_generate failed: it ended without a result \(signal 6\)$"):
        run_generate(tmp_path, "1.8.0-npu-4K")


def test_a_module_planted_in_the_cwd_is_refused(fake_sdk, tmp_path, monkeypatch):
    marker = tmp_path / "planted-ran"
    (Path.cwd() / "model_generate.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\ndef generate_model(**kw): pass\n")
    monkeypatch.syspath_prepend(str(Path.cwd()))  # as `python -m` puts the cwd first
    with pytest.raises(RaipackError, match=r"model_generate module found at .*model_generate.py is inside the current folder"):
        run_generate(tmp_path, "1.8.0-npu-4K")
    with pytest.raises(RaipackError, match="inside the current folder"):
        choose_backend("auto")
    assert not marker.exists() and recorded(fake_sdk) == []


def test_a_planted_module_off_the_path_is_never_imported(fake_sdk, tmp_path):
    """The cwd holds a model_generate.py but is not on sys.path: the real module runs, from a child
    whose working folder is empty, and the planted one is never imported."""
    marker = tmp_path / "planted-ran"
    (Path.cwd() / "model_generate.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    run_generate(tmp_path, "1.8.0-npu-4K")
    assert len(recorded(fake_sdk)) == 1 and not marker.exists()


def test_a_module_inside_the_export_is_refused(fake_sdk, tmp_path, monkeypatch):
    export = tmp_path / "export"
    (export / "model_generate").mkdir(parents=True)
    (export / "model_generate" / "__init__.py").write_text("raise SystemExit('planted')\n")
    monkeypatch.syspath_prepend(str(export))
    with pytest.raises(RaipackError, match=r"inside an input of this build"):
        run_generate(tmp_path, "1.8.0-npu-4K")


def test_a_folder_named_like_the_module_is_not_an_install(tmp_path, monkeypatch):
    """An output folder called model_generate in the cwd (a namespace package on a `python -m` path) is no SDK."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model_generate").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("RAIPACK_MODEL_GENERATE", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    assert sdk.find_module() == (None, "")
    assert choose_backend("auto")[0] == "reference"


def test_auto_prefers_the_python_module(fake_sdk):
    backend, why = choose_backend("auto")
    assert backend == "ryzenai-sdk" and "Python module" in why


def test_executable_argv_per_target():
    call = sdk.call_settings(get("1.8.0-hybrid"))
    assert sdk.argv("mg", call, Path("e"), Path("o")) == ["mg", "--hybrid", "o", "e"]
    call = sdk.call_settings(get("1.8.0-npu-4K"), FuseConfig(recipe="eager", mem_optimize=True))
    assert sdk.argv("mg", call, Path("e"), Path("o")) == ["mg", "--npu", "o", "e", "--eager", "--mem_optimize"]


def test_options_the_backend_cannot_take_are_refused(monkeypatch):
    with pytest.raises(UsageError, match=r"\[fuse\] recipe is an option of AMD's model_generate"):
        preflight(FuseConfig(backend="reference", recipe="basic"), get("1.8.0-npu-4K"))
    with pytest.raises(UsageError, match=r"\[fuse\] mem_optimize is an option"):
        preflight(FuseConfig(backend="reference", mem_optimize=True), get("1.8.0-npu-4K"))
    with pytest.raises(UsageError, match="profile 1.6-npu has no model_generate settings"):
        preflight(FuseConfig(backend="ryzenai-sdk"), get("1.6-npu"))
    with pytest.raises(UsageError, match=r"extra_options.max_seq_len is 8192; expected a string"):
        preflight(FuseConfig(backend="ryzenai-sdk", extra_options={"max_seq_len": 8192}), get("1.8.0-npu-16K"))
    with pytest.raises(UsageError, match="recipe"):
        load(None, {"fuse.recipe": "fastest"})
    with pytest.raises(UsageError, match="extra_options"):
        load(None, {"fuse.extra_options": {"max_seq_len": 8192}})


# ------------------------------------------------------------------- through the runner: output checks


@pytest.fixture
def runner_env(fake_sdk, tmp_path, monkeypatch):
    """Fake source/quantize/export stages (tests/fake_stages.py), the real fuse stage; the fake
    model_generate copies a factory package of the target."""
    monkeypatch.setenv("RAIPACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fake_stages, "CALLS", tmp_path / "stage-calls.txt")
    fuse = dataclasses.replace(FUSE, tools=())  # no onnx/onnxruntime version lookups: this is about the output
    monkeypatch.setattr("raipack.builder.stages.get", {**fake_stages.FAKES, "fuse": fuse}.__getitem__)
    monkeypatch.setenv("FAKE_MG_PACKAGE", str(make_package(tmp_path / "amd", "1.8.0-npu-16K", name="pkg")))
    return tmp_path


def sdk_build(**kw):
    return build(load(None, {"output": "build", "fuse.backend": "ryzenai-sdk", **kw}), until="fuse")


def test_a_complete_package_passes_and_records_how_it_ran(runner_env, fake_sdk):
    result = sdk_build()
    assert result.package is not None and (result.package / "model.pb.bin").is_file()
    fuse = result.stages[-1]
    assert fuse.status == "built" and fuse.report["sdk"]["via"] == "python" and fuse.report["sdk"]["recipe"] == "token_fusion"
    (call,) = recorded(fake_sdk)
    assert call["input_model"] == str(result.stages[-2].path)  # the cached export folder
    sdk_build(**{"fuse.recipe": "basic"})  # the recipe enters the cache key: fuse runs again
    assert [c["recipe"] for c in recorded(fake_sdk)] == ["token_fusion", "basic"]


def test_a_hybrid_target_hands_model_generate_the_quark_folder(runner_env, fake_sdk, monkeypatch):
    """AMD's hybrid flow makes its own DirectML export: given an OGA folder it would skip it (profile sdk.input)."""
    monkeypatch.setenv("FAKE_MG_PACKAGE", str(make_package(runner_env / "amd-hybrid", "1.8.0-hybrid", name="pkg")))
    result = sdk_build(profile="1.8.0-hybrid")
    (call,) = recorded(fake_sdk)
    by_name = {s.name: s for s in result.stages}
    assert call["mode"] == "hybrid" and call["input_model"] == str(by_name["quantize"].path) != str(by_name["export"].path)
    assert by_name["fuse"].report["sdk"]["input"] == "quantize" and result.package is not None


@pytest.mark.parametrize("drop, named", [
    ("model.pb.bin", "model.pb.bin"),
    ("genai_config.json", "genai_config.json"),
    ("dd_metastate_*", "dd_metastate"),  # AMD's 1.8 layout has one set per node, not per tier: RP601 wants the sets
    ("cache", "cache"),
])
def test_an_incomplete_package_fails_the_stage_and_lands_nowhere(runner_env, monkeypatch, drop, named):
    assert list((runner_env / "amd" / "pkg").glob(drop))  # the fake's package has it: only the drop makes it fail
    monkeypatch.setenv("FAKE_MG_DROP", drop)
    with pytest.raises(StageFailed, match=rf"^stage fuse wrote an output that fails its checks: .*{named}"):
        sdk_build()
    assert not (cache.cache_root() / "stages" / "fuse").exists() or list((cache.cache_root() / "stages" / "fuse").iterdir()) == []
    assert [p.name for p in Path("build").iterdir() if not p.name.endswith(".stages")] == []


def test_a_raise_through_the_runner_leaves_nothing(runner_env, monkeypatch):
    monkeypatch.setenv("FAKE_MG_HOW", "raise")
    with pytest.raises(RaipackError, match="^model_generate failed: RuntimeError: unsupported operator pattern in layer 3$"):
        sdk_build()
    fuse_entries = cache.cache_root() / "stages" / "fuse"
    assert not fuse_entries.exists() or list(fuse_entries.iterdir()) == []
    shutil.rmtree("build", ignore_errors=True)
