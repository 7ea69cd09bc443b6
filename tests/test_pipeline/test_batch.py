"""raipack batch: stage jobs, the first-commit-wins cache, the matrix, the graph deduplicated by cache key,
the memory-aware local executor, the command. Fake stages (tests/fake_stages.py) except one real 2-job batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fake_stages
from pipeline.batch.jobs import StageJob, job_key, run_stage_job
from pipeline.build import cache
from pipeline.build.recipe import load
from pipeline.core import manifest

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("RAIPACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("RAIPACK_FAKE_CALLS", str(tmp_path / "calls.txt"))
    monkeypatch.setattr(fake_stages, "CALLS", tmp_path / "calls.txt")
    monkeypatch.setattr("pipeline.build.stages.get", fake_stages.FAKES.__getitem__)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def calls(env) -> list[str]:
    p = env / "calls.txt"
    return p.read_text().split() if p.exists() else []


def test_stage_job_builds_then_hits(env):
    recipe = load(None, {"output": "build"})
    source = StageJob("source", "e1", recipe)
    first = run_stage_job(source.to_dict())
    assert first["status"] == "built" and manifest.is_complete(Path(first["path"]))
    quantize = StageJob("quantize", "e1", recipe, {"source": Path(first["path"])})
    quantize.key = job_key(quantize)
    built = run_stage_job(json.loads(json.dumps(quantize.to_dict())))  # JSON-safe
    assert built["status"] == "built" and built["key"] == quantize.key
    assert run_stage_job(quantize.to_dict())["status"] == "cached"
    assert calls(env) == ["source", "quantize"]


RACE_SCRIPT = """
import dataclasses, json, os, sys, time
import fake_stages
fake_stages.install()
barrier = sys.argv[2]
real = fake_stages.FAKES["quantize"]

def run(job):  # both writers are inside the stage before either commits
    with open(barrier, "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    deadline = time.monotonic() + 30
    while len(open(barrier).read().split()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    return real.run(job)

fake_stages.FAKES["quantize"] = dataclasses.replace(real, run=run)
from pipeline.batch.jobs import run_stage_job
print(json.dumps(run_stage_job(json.loads(sys.argv[1]))))
"""


def test_two_writers_of_one_key_end_with_one_entry(env):
    recipe = load(None, {"output": "build"})
    src = run_stage_job(StageJob("source", "e1", recipe).to_dict())
    job = StageJob("quantize", "e1", recipe, {"source": Path(src["path"])})
    job.key = job_key(job)
    penv = {**os.environ, "PYTHONPATH": str(TESTS), fake_stages.NO_DELAY_ENV: "1"}
    procs = [subprocess.Popen([sys.executable, "-c", RACE_SCRIPT, json.dumps(job.to_dict()), str(env / "barrier")], env=penv,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    results = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    assert sorted(r["status"] for r in results) == ["built", "cached"]  # first commit wins, the other is a hit
    assert len({r["path"] for r in results}) == 1 and len((env / "barrier").read_text().split()) == 2
    entry = cache.entry("quantize", job.key)
    assert manifest.is_complete(entry) and cache.lookup("quantize", job.key, verify=True) == entry
    assert [p.name for p in entry.parent.iterdir()] == [job.key]  # no staging folder left behind
