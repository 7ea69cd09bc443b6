"""raipack batch: stage jobs, the first-commit-wins cache, the matrix, the graph deduplicated by cache key,
the memory-aware local executor, the command. Fake stages (tests/fake_stages.py) except one real 2-job batch."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fake_stages
from raipack.batch.jobs import StageJob, job_key, run_stage_job
from raipack.builder import cache
from raipack.builder.recipe import load
from raipack.core import manifest
from raipack.validate import validate

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def env(tmp_path, monkeypatch):
    return fake_stages.use_in_test(tmp_path, monkeypatch)


calls = fake_stages.calls_in


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
from raipack.batch.jobs import run_stage_job
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


# --------------------------------------------------------------------------- the matrix and the graph

def write_matrix(env: Path, models=("a", "b", "c"), profiles=("1.8.0-npu-16K", "1.8.0-npu-4K"), extra: str = "") -> Path:
    for name in models:  # three different model folders (each its own digest); the fake stages never read them
        (env / "models" / name).mkdir(parents=True, exist_ok=True)
        (env / "models" / name / "config.json").write_text(json.dumps({"name": name}))
    text = 'output = "zoo"\n' + f"profiles = {json.dumps(list(profiles))}\n"
    text += "".join(f'[[models]]\nname = "{m}"\npath = "models/{m}"\n' for m in models) + extra
    path = env / "matrix.toml"
    path.write_text(text)
    return path


@pytest.fixture
def batch_env(env, monkeypatch):
    """Fake stages that, like the real ones, read no profile key in quantize and export (checked here)."""
    fakes = dict(fake_stages.FAKES)
    for name in ("quantize", "export"):
        assert _real_stage(name).profile_keys == (), name
        fakes[name] = dataclasses.replace(fakes[name], profile_keys=())
    fakes["fuse"] = dataclasses.replace(fakes["fuse"], output_profile=_reference_id, run=lambda job: fake_stages._writer(_reference_id(job))(job))
    monkeypatch.setattr("raipack.builder.stages.get", fakes.__getitem__)
    monkeypatch.setattr("raipack.batch.matrix.check_model_dir", lambda path, trust: path.resolve())
    # each package's report.html (matplotlib, ~0.5 s each) is raipack build's, tested there; not drawn here
    monkeypatch.setattr("raipack.report.page.write_build_page", lambda *a, **kw: None)
    return env


def _reference_id(job) -> str:
    """The fake fuse writes the package of the job's target (reference-4K for 1.8.0-npu-4K)."""
    from raipack.npu.profile import reference_for

    return reference_for(job.profile).id


def _real_stage(name: str):
    import importlib

    from raipack.data import load_data

    return importlib.import_module(load_data("stages.json")["modules"][name]).STAGE


def fork_executor(kind, jobs, address, root, warn, memory_free):
    """The local executor with forked workers: they inherit this process's fake stages."""
    from raipack.batch.local import LocalExecutor

    return LocalExecutor(jobs, memory_free, start_method="fork", warn=warn)


def run(path: Path, **kw):
    from raipack.batch.run import run_batch

    lines: list[str] = []
    doc = run_batch(path, line=lines.append, warn=lines.append, make=kw.pop("make", fork_executor), **kw)
    return doc, lines


def test_three_models_two_profiles_quantize_three_times_not_six(batch_env):
    doc, lines = run(write_matrix(batch_env), jobs=2)
    assert doc["jobs"] == {"quantize": 3, "export": 3, "fuse": 6, "smoke": 6}  # quantize and export read no profile key
    assert [e["status"] for e in doc["entries"]] == ["built"] * 6, [e["error"] for e in doc["entries"]]
    assert sorted(calls(batch_env)) == sorted(["quantize"] * 3 + ["export"] * 3 + ["fuse"] * 6 + ["smoke"] * 6)
    assert len(lines) == 18 and sum(line.startswith("quantize") and "(+1 entry)" in line for line in lines) == 3
    for e in doc["entries"]:
        assert validate(Path(e["package"])).failed() is False
        assert Path(e["package"]).parent == batch_env / "zoo"
    quantize = [s for e in doc["entries"] for s in e["stages"] if s["stage"] == "quantize"]
    assert len({s["key"] for s in quantize}) == 3 and sum("shared_with" in s for s in quantize) == 3


def test_a_failed_job_fails_its_dependants_only(batch_env):
    extra = '[[overrides]]\nname = "good"\n[[overrides]]\nname = "bad"\nfuse = { fail = true }\n'
    doc, lines = run(write_matrix(batch_env, models=("a",), extra=extra), jobs=2)
    by_id = {e["entry"]: e for e in doc["entries"]}
    assert {i: e["status"] for i, e in by_id.items()} == {"a@1.8.0-npu-16K+good": "built", "a@1.8.0-npu-16K+bad": "failed",
                                                             "a@1.8.0-npu-4K+good": "built", "a@1.8.0-npu-4K+bad": "failed"}
    bad = by_id["a@1.8.0-npu-16K+bad"]
    assert bad["error"].startswith("fuse: stage fuse wrote an output that fails its checks") and bad["package"] is None
    assert bad["hint"] and by_id["a@1.8.0-npu-16K+good"]["hint"] == ""  # the stage's hint travels with its sentence
    assert any("\n  hint: " in line for line in lines)  # under the failed job's line
    assert [s["status"] for s in bad["stages"]] == ["cached", "built", "failed", "skipped"] or \
        [s["status"] for s in bad["stages"]][-2:] == ["failed", "skipped"]
    assert Path(by_id["a@1.8.0-npu-16K+good"]["package"]).parent == batch_env / "zoo" / "good"
    from raipack.batch.run import exit_code

    assert exit_code(doc) == 1 and doc["jobs"]["quantize"] == 1  # one quantize for the four entries
    ran = len(calls(batch_env))
    again, _ = run(write_matrix(batch_env, models=("a",), extra=extra), jobs=2)  # a rerun picks up from the cache
    assert [e["status"] for e in again["entries"]] == [e["status"].replace("built", "cached") for e in doc["entries"]]
    assert calls(batch_env)[ran:] == ["fuse", "fuse"]  # only the failed jobs run again (and fail again)


@pytest.mark.parametrize("text, expected", [
    ('profiles = ["1.8.0-npu-16K"]\n[[models]]\nname = "a"\n', r"matrix.toml: /models/0/path is missing"),
    ('profiles = ["nope"]\n[[models]]\nname = "a"\nexample = true\n', r"/profiles: 'nope' is not a profile"),
    ('profiles = ["1.8.0-npu-16K"]\n[[models]]\nname = "a"\nexample = true\n[recipe.quantize]\ngrup = 1\n',
     r"entry a@1.8.0-npu-16K: \[quantize\]: unknown option 'grup'"),
    ('profiles = ["1.8.0-npu-16K"]\n[[models]]\nname = "a"\nexample = true\n[[models]]\nname = "a"\nexample = true\n',
     r"/models/1/name 'a' is used twice"),
])
def test_a_bad_matrix_is_one_sentence_and_builds_nothing(env, text, expected):
    from raipack.batch.matrix import load
    from raipack.core.errors import UsageError

    (env / "matrix.toml").write_text(text)
    with pytest.raises(UsageError, match=expected) as err:
        load(env / "matrix.toml")
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    assert not (env / "zoo").exists() and calls(env) == []


# --------------------------------------------------------------------------- the local executor

def _admitted(arg: dict) -> dict:
    """A job that records when it ran (start, end) in its own file, so the test sees what overlapped."""
    import time

    start = time.monotonic()
    time.sleep(arg["seconds"])
    Path(arg["log"]).write_text(json.dumps([start, time.monotonic(), arg["memory"]]))
    return {"memory": arg["memory"]}


def test_the_local_executor_never_admits_more_memory_than_is_free(tmp_path):
    from raipack.batch.local import GIB, LocalExecutor

    free = 10 * GIB  # a fake machine with 10 GiB free whatever runs (the running jobs' estimates are subtracted)
    warnings: list[str] = []
    ex = LocalExecutor(3, memory_free=lambda: free, start_method="fork", warn=warnings.append)
    sizes = [6, 6, 3, 3, 3, 12]  # GiB; the last is larger than the machine: it runs alone, with a warning
    handles = [ex.submit(_admitted, {"seconds": 0.3, "memory": n * GIB, "log": str(tmp_path / f"{i}.json")}, {"memory": n * GIB})
               for i, n in enumerate(sizes)]
    pending = handles
    while pending:
        _, pending = ex.wait(pending, None)
    assert [ex.result(h)["memory"] for h in handles] == [n * GIB for n in sizes]
    ex.shutdown()
    spans = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(len(sizes))]
    for start, _, _ in spans:  # at every job's start: the memory of the jobs then running fits in what is free
        running = [m for s, e, m in spans if s <= start < e]
        assert sum(running) <= free or running == [12 * GIB], running
    assert ex.peak >= 2  # small jobs did run side by side
    assert len(warnings) == 1 and "12.0 GiB" in warnings[0] and "runs alone" in warnings[0]


# --------------------------------------------------------------------------- the command

def test_the_command_writes_junit_and_json_and_exits_1_on_a_failed_entry(batch_env, monkeypatch):
    from click.testing import CliRunner

    from raipack.cli import cli

    monkeypatch.setattr("raipack.batch.run.make_executor", fork_executor)
    extra = '[[overrides]]\nname = "good"\n[[overrides]]\nname = "bad"\nfuse = { fail = true }\n'
    matrix = write_matrix(batch_env, models=("a",), profiles=("1.8.0-npu-16K",), extra=extra)
    res = CliRunner().invoke(cli, ["batch", str(matrix), "--format", "junit", "-o", str(batch_env / "r.xml"), "--jobs", "2"])
    assert res.exit_code == 1, res.output
    import xml.etree.ElementTree as ET

    cases = ET.parse(batch_env / "r.xml").getroot().findall("testcase")
    assert [c.get("name") for c in cases] == ["a@1.8.0-npu-16K+good", "a@1.8.0-npu-16K+bad"]
    assert cases[0].find("failure") is None and "fails its checks" in cases[1].find("failure").get("message")
    assert "\nhint: " in cases[1].find("failure").text
    res = CliRunner().invoke(cli, ["batch", str(matrix), "--format", "json"])
    doc = json.loads(res.stdout)
    assert res.exit_code == 1 and [e["status"] for e in doc["entries"]] == ["cached", "failed"]
    assert doc["jobs"] == {"quantize": 1, "export": 1, "fuse": 2, "smoke": 1}


def test_ray_without_ray_installed_is_one_sentence(batch_env, monkeypatch, capsys):
    from raipack.cli.main import main

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    with pytest.raises(SystemExit) as exit_:
        main(["batch", str(write_matrix(batch_env, models=("a",))), "--executor", "ray"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--executor ray needs the ray package" in err and "Traceback" not in err
    assert calls(batch_env) == [] and not (batch_env / "zoo").exists()


def test_a_real_two_job_batch_of_a_tiny_model(tiny_llama, tmp_path, monkeypatch):
    """Real stages in spawned worker processes (the default executor): one tiny model x 2 profiles, RTN.
    One quantize and one export serve both entries; the two fuse jobs may run side by side."""
    from raipack.batch.run import exit_code, run_batch

    monkeypatch.setenv("RAIPACK_CACHE", str(tmp_path / "cache"))
    matrix = tmp_path / "m.toml"
    matrix.write_text(f'output = "zoo"\nprofiles = ["1.8.0-npu-4K", "1.7.1-npu-4K"]\n[[models]]\nname = "tiny"\npath = "{tiny_llama}"\n'
                      '[recipe.quantize]\nalgorithm = "rtn"\nquality = false\n[model_package]\nassemble = true\n')
    lines: list[str] = []
    doc = run_batch(matrix, jobs=2, line=lines.append, warn=lines.append)
    assert exit_code(doc) == 0, [e["error"] for e in doc["entries"]]
    assert doc["jobs"] == {"quantize": 1, "export": 1, "fuse": 2, "smoke": 2} and len(lines) == 6
    for e in doc["entries"]:
        assert e["status"] == "built" and validate(Path(e["package"])).failed() is False
        assert manifest.read(Path(e["package"]))["target_profile"] == e["profile"]
    assembled = doc["model_packages"]["tiny"]  # H9: one ORT model package, its cpu variant the export found in the batch's cache
    assert assembled["status"] == "built" and validate(Path(assembled["package"])).failed() is False, assembled
    variants = json.loads((Path(assembled["package"]) / "manifest.json").read_text())["components"]["model"]["variants"]
    assert sorted(variants) == ["1.7.1-npu-4K", "1.8.0-npu-4K", "cpu"]


def test_a_failed_model_package_fails_the_batch_and_is_in_the_table():
    from raipack.batch.report import table
    from raipack.batch.run import exit_code

    entry = {"entry": "a@p", "status": "built", "package": "zoo/a_p", "error": None, "stages": []}
    failed = {"a": {"status": "failed", "package": None, "error": "variant p: broken"}}
    assert exit_code({"entries": [entry]}) == 0 and exit_code({"entries": [entry], "model_packages": failed}) == 1
    assert "a (model package)  failed  variant p: broken" in table([entry], {"fuse": 1}, failed)


# --------------------------------------------------------------------------- bounds (issue 24)

def test_a_matrix_over_the_entry_limit_is_refused_before_expansion(env, monkeypatch):
    """10^4 entries took 22.5 s and 340 MB to check before any output: the count comes first, from the
    lists' lengths (the entries are never expanded), and --max-entries raises the bound."""
    from raipack.batch import matrix
    from raipack.core.errors import UsageError

    calls = []
    monkeypatch.setattr(matrix, "_entry", lambda *a, **kw: calls.append(1))
    text = 'profiles = ["1.8.0-npu-16K", "1.8.0-npu-4K"]\n' + "".join(f'[[models]]\nname = "m{i}"\npath = "x"\n' for i in range(501))
    (env / "matrix.toml").write_text(text)
    with pytest.raises(UsageError, match=r"501 models x 2 profiles x 1 override sets make 1002 entries, above the limit of 1000") as info:
        matrix.load(env / "matrix.toml")
    assert "--max-entries" in info.value.hint and calls == []
    matrix.load(env / "matrix.toml", max_entries=1002)
    assert len(calls) == 1002


def test_the_command_takes_max_entries_and_exits_2_over_it(env, capsys):
    from raipack.cli import main

    text = 'profiles = ["1.8.0-npu-16K"]\n' + "".join(f'[[models]]\nname = "m{i}"\npath = "x"\n' for i in range(3))
    (env / "matrix.toml").write_text(text)
    with pytest.raises(SystemExit) as done:
        main(["batch", str(env / "matrix.toml"), "--max-entries", "2"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "make 3 entries, above the limit of 2" in err and "Traceback" not in err
    assert not (env / "zoo").exists()


@pytest.mark.parametrize("case", ["fifo", "deep", "folder"])
def test_a_matrix_that_is_a_fifo_deep_or_a_folder_is_one_sentence(env, case):
    """A FIFO hung the read; deep TOML raised RecursionError from tomllib."""
    import os
    import threading

    from raipack.batch.matrix import load
    from raipack.core.errors import UsageError

    path = env / "matrix.toml"
    if case == "fifo":
        os.mkfifo(path)
    elif case == "deep":
        path.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    else:
        path.mkdir()
    done = []
    t = threading.Thread(target=lambda: done.append(pytest.raises(UsageError, load, path)), daemon=True)
    t.start()
    t.join(10)
    assert done, "load did not return within 10 s"
    expect = {"fifo": "is not a plain file", "folder": "is not a plain file", "deep": "nests arrays or tables too deeply"}[case]
    assert expect in str(done[0].value)


def test_validate_with_a_ray_address_where_nothing_listens_is_one_sentence_in_seconds(tmp_path):
    """`validate --executor ray --address 127.0.0.1:1` hung past 120 s with Ray's gcs_client lines on the terminal."""
    pytest.importorskip("ray", reason="ray (raipack's cluster extra) is not installed")
    import time

    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "raipack.cli", "validate", "--executor", "ray", "--address", "127.0.0.1:1", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "RAIPACK_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 2, done.stderr
    assert "no Ray cluster at 127.0.0.1:1 (connection refused)" in done.stderr
    assert "gcs_client" not in done.stderr and "Traceback" not in done.stderr and done.stderr.count("ERROR:") == 1
    assert time.monotonic() - t0 < 30
