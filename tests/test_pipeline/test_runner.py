"""The stage runner with fake stages: cache, staging, --until/--from, kill safety."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fake_stages
from pipeline import cache, manifest
from pipeline.errors import RaipackError, UsageError
from pipeline.recipe import load
from pipeline.runner import StageFailed, build
from pipeline.validate import validate

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("RAIPACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("RAIPACK_FAKE_CALLS", str(tmp_path / "calls.txt"))
    monkeypatch.setattr(fake_stages, "CALLS", tmp_path / "calls.txt")
    monkeypatch.setattr("pipeline.stage.get", fake_stages.FAKES.__getitem__)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def calls(env) -> list[str]:
    p = env / "calls.txt"
    return p.read_text().split() if p.exists() else []


def recipe(**kw):
    return load(None, {"output": "build", **kw})


def test_full_build_then_cached_rerun(env):
    first = build(recipe())
    assert [s.status for s in first.stages] == ["built"] * 5
    assert first.package == Path("build/SmolLM2-135M-Instruct_rai_1.8.0_npu_16K")
    assert validate(first.package).failed() is False
    assert json.loads((first.package / "report.json").read_text())["stages"][0]["name"] == "source"
    again = build(recipe())
    assert [s.status for s in again.stages] == ["cached"] * 5
    assert calls(env) == ["source", "quantize", "export", "fuse", "smoke"]


def test_until_and_from(env):
    build(recipe(), until="quantize")
    assert calls(env) == ["source", "quantize"]
    assert (env / "build" / "SmolLM2-135M-Instruct_rai_1.8.0_npu_16K.stages" / "quantize" / "manifest.json").exists()
    build(recipe(), until="export", from_="quantize")
    assert calls(env) == ["source", "quantize", "quantize", "export"]


def test_from_needs_cached_upstream(env):
    with pytest.raises(UsageError, match="not in the cache"):
        build(recipe(), from_="export")


def test_config_change_rebuilds_only_downstream(env):
    build(recipe(), until="export")
    build(load(None, {"output": "build", "export.delay": 0.001}), until="export")
    assert calls(env) == ["source", "quantize", "export", "export"]


def test_unknown_stage_option_is_refused(env):
    with pytest.raises(UsageError, match=r"\[quantize\]: unknown option 'grup_size'"):
        build(load(None, {"quantize.grup_size": 64}), until="quantize")


def test_bad_output_fails_the_stage_and_leaves_nothing(env):
    with pytest.raises(StageFailed, match="model.onnx"):
        build(load(None, {"output": "build", "export.fail": True}), until="export")
    stage_dir = cache.cache_root() / "stages" / "export"
    assert list(stage_dir.iterdir()) == []


def test_recipe_file_is_schema_checked(env):
    bad = env / "r.toml"
    bad.write_text('profile = "1.8.0-npu-16K"\nmodle = "x"\n')
    with pytest.raises(UsageError, match="r.toml: .*modle"):
        load(bad)
    bad.write_text("profile = [")
    with pytest.raises(UsageError, match="not valid TOML"):
        load(bad)


def test_hub_name_is_refused_offline(env):
    with pytest.raises(UsageError, match="never downloads"):
        build(recipe(model="HuggingFaceTB/SmolLM2-135M-Instruct"))


def test_read_only_output_location(env, monkeypatch):
    ro = env / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    # root ignores permission bits, so the check's answer is simulated too
    monkeypatch.setattr("pipeline.runner.os.access", lambda path, mode: False)
    with pytest.raises(UsageError, match="not writable"):
        build(recipe(output=str(ro)))
    assert list(ro.iterdir()) == []


def test_output_on_a_file(env):
    (env / "afile").write_text("x")
    with pytest.raises(UsageError, match="cannot be created"):
        build(recipe(output=str(env / "afile" / "out")))


def passes(folder: Path) -> bool:
    try:
        return not validate(folder).failed()
    except RaipackError:
        return False


KILL_SCRIPT = """
import sys
sys.path.append(sys.argv[1])
import fake_stages
fake_stages.install()
from pipeline.recipe import load
from pipeline.runner import build
build(load(None, {"output": "build", "quantize.delay": 0.01, "export.delay": 0.01, "fuse.delay": 0.01, "smoke.delay": 0.01}))
"""


def test_sigkill_at_random_moments_always_recovers(env):
    """20 builds killed with SIGKILL at random moments; every rerun finishes and no partial folder passes as done."""
    rng = random.Random(7)
    final = env / "build" / "SmolLM2-135M-Instruct_rai_1.8.0_npu_16K"
    finished_before_kill = 0
    for i in range(20):
        proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(TESTS)], cwd=env, env=os.environ.copy(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.05, 1.5))
        proc.send_signal(signal.SIGKILL)
        if proc.wait() == 0:
            finished_before_kill += 1
        for entry in cache.entries():
            if entry["key"].startswith("."):  # a killed stage's staging folder: never an entry
                assert not entry["complete"] and not manifest.is_complete(Path(entry["path"]))
            else:
                assert manifest.is_complete(Path(entry["path"])), entry
        for partial in (env / "build").glob(".*-*"):  # staging and old folders of the package
            assert not passes(partial)
        if final.exists():
            assert passes(final)
        if i % 4 == 3:  # now and then, let a rerun finish
            subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(TESTS)], cwd=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            assert not validate(final).failed()
            cache.clear()
    subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(TESTS)], cwd=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert not validate(final).failed()
    assert finished_before_kill < 20
