"""The stage runner with fake stages: cache, staging, --until/--from, kill safety."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fake_stages
from raipack.builder import cache
from raipack.builder.recipe import load
from raipack.builder.runner import StageFailed, build
from raipack.core import manifest
from raipack.core.errors import RaipackError, UsageError
from raipack.validate import validate

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def env(tmp_path, monkeypatch):
    return fake_stages.use_in_test(tmp_path, monkeypatch)


calls = fake_stages.calls_in


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
    monkeypatch.setattr("raipack.builder.runner.os.access", lambda path, mode: False)
    with pytest.raises(UsageError, match="not writable"):
        build(recipe(output=str(ro)))
    assert list(ro.iterdir()) == []


def test_output_on_a_file(env):
    (env / "afile").write_text("x")
    with pytest.raises(UsageError, match="cannot be created"):
        build(recipe(output=str(env / "afile" / "out")))


def test_reports_and_lineage_name_no_staging_folder(env, monkeypatch):
    """A stage's report mentioning its own folder (job.workdir, a staging folder that is gone once
    the stage is committed) names the cache entry instead, in report.json and every manifest."""
    real = fake_stages.FAKES["quantize"]

    def run(job):
        return {**real.run(job), "out_dir": str(job.workdir), "files": [str(job.workdir / "config.json")]}
    monkeypatch.setattr("raipack.builder.stages.get", {**fake_stages.FAKES, "quantize": dataclasses.replace(real, run=run)}.__getitem__)
    result = build(recipe())
    text = (result.package / "report.json").read_text()
    assert ".staging-" not in text
    (quantized,) = [s for s in result.stages if s.name == "quantize"]
    report = next(s["report"] for s in json.loads(text)["stages"] if s["name"] == "quantize")
    assert report["out_dir"] == quantized.path and report["files"] == [str(Path(quantized.path) / "config.json")]
    assert Path(quantized.path).is_dir()
    for folder in [result.package, *(Path(s.path) for s in result.stages)]:
        assert ".staging-" not in json.dumps(manifest.read(folder)), folder


def test_the_runner_knows_stages_by_kind_not_by_name(env, monkeypatch):
    """Renamed stages: the one of kind "source" is the one a model folder replaces, the one of kind
    "package" the one assembled into the package."""
    new = {"source": "origin", "quantize": "q", "export": "x", "fuse": "pack", "smoke": "check"}
    fakes = {new[n]: dataclasses.replace(st, name=new[n], inputs=tuple(new[i] for i in st.inputs)) for n, st in fake_stages.FAKES.items()}
    monkeypatch.setattr("raipack.builder.stages.order", lambda: list(fakes))
    monkeypatch.setattr("raipack.builder.stages.get", fakes.__getitem__)
    monkeypatch.setattr("raipack.builder.runner.check_model_dir", lambda path, trust: path.resolve())
    (env / "MyModel").mkdir()
    result = build(recipe(model=str(env / "MyModel")))
    assert calls(env) == ["q", "x", "pack", "check"]  # the model folder stands in for "origin"
    assert result.stages[0].report["inputs"] == ["origin"]
    assert result.package == Path("build/MyModel_rai_1.8.0_npu_16K") and validate(result.package).failed() is False
    (pack,) = [s for s in result.stages if s.name == "pack"]
    assert manifest.read(result.package)["lineage"]["inputs"] == [{"stage": "pack", "path": pack.path, "sha256": cache.folder_digest(Path(pack.path))}]


def passes(folder: Path) -> bool:
    try:
        return not validate(folder).failed()
    except RaipackError:
        return False


STAGES = ("source", "quantize", "export", "fuse", "smoke")
MUST_COVER = (*STAGES, "assemble", "rename")  # where the kills have to land, each at least once
KILL_BUILD = {"output": "build", **{f"{s}.seconds": 0.4 for s in STAGES}}  # each stage about as long as the runner's checks of a package
KILL_SCRIPT = """
import json, sys
import fake_stages
fake_stages.install()
from raipack.builder.recipe import load
from raipack.builder.runner import build
fake_stages.log_phase("begin")
result = build(load(None, json.loads(sys.argv[1])))
fake_stages.log_phase("end")
print(json.dumps({s.name: s.status for s in result.stages}))
"""


def start_build(env: Path, phases: Path | None = None, pause: float = 0.0) -> subprocess.Popen:
    """A build in a subprocess; without a phase log (a rerun), at full speed."""
    extra = {fake_stages.PHASES_ENV: str(phases), fake_stages.PAUSE_ENV: str(pause)} if phases else {fake_stages.NO_DELAY_ENV: "1"}
    extra["PYTHONPATH"] = str(TESTS)  # fake_stages
    return subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, json.dumps(KILL_BUILD)], cwd=env, env={**os.environ, **extra},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def communicate(proc: subprocess.Popen, timeout: float = 60) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the build did not end within {timeout} s:\n{err[-2000:]}")


def finish(proc: subprocess.Popen) -> dict:
    """The stage statuses of a build that must complete, in bounded time."""
    out, err = communicate(proc)
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def phase_time(proc: subprocess.Popen, phases: Path, phase: str) -> float | None:
    """Wait until the build logs `phase`; its time, or None when the build ended without it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for t, p in fake_stages.read_phases(phases):
            if p == phase:
                return t
        if proc.poll() is not None:
            return None
        time.sleep(0.002)
    proc.kill()
    pytest.fail(f"the build never reached {phase}: {fake_stages.read_phases(phases)}")


def kill_build(env: Path, phases: Path, pause: float, after: str, offset: float) -> tuple[str, list]:
    """Start a build, SIGKILL it `offset` seconds after it logs `after`; the phase it died
    in ("finished" when it ended first) and its phase log."""
    phases.unlink(missing_ok=True)
    proc = start_build(env, phases, pause)
    t0 = phase_time(proc, phases, after)
    if t0 is not None:
        time.sleep(max(0.0, t0 + offset - time.monotonic()))
        proc.send_signal(signal.SIGKILL)
    _, err = communicate(proc)
    assert proc.returncode in (0, -signal.SIGKILL), err[-2000:]
    log = fake_stages.read_phases(phases)
    assert log, err[-2000:]
    return ("finished" if proc.returncode == 0 else log[-1][1]), log


def files_not_matching(folder: Path, doc: dict) -> list[str]:
    """The files a manifest lists that are missing or differ in size or sha256."""
    bad = []
    for item in doc.get("files", []):
        path = folder / item["path"]
        if not path.is_file() or path.stat().st_size != item["size"] or hashlib.sha256(path.read_bytes()).hexdigest() != item["sha256"]:
            bad.append(item["path"])
    return bad


def assert_nothing_looks_finished_that_is_not(roots: list[Path], pkg_name: str, entries_root: Path) -> list[str]:
    """Walk the output and the cache: a folder whose manifest says complete (and no
    incomplete marker) holds every listed file intact; a folder at the package's name
    has such a manifest; a folder at a cache entry's name has one or says it is incomplete.
    Returns the names of the hidden (dot) folders met: what killed builds left."""
    hidden = []
    for root in roots:
        for dirpath, _, _ in os.walk(root):
            folder = Path(dirpath)
            if folder.name.startswith("."):
                hidden.append(folder.name)
            doc = manifest.read(folder)
            marked = (folder / manifest.INCOMPLETE).exists()
            if doc is not None and not marked:
                assert not files_not_matching(folder, doc), f"{folder} looks finished but {files_not_matching(folder, doc)[:3]} are missing or differ"
            if folder.name == pkg_name:
                assert doc is not None and not marked, f"{folder} has the package's name but no complete manifest"
            if folder.parent.parent == entries_root and not folder.name.startswith("."):
                assert doc is not None or marked, f"cache entry {folder} has no manifest and no incomplete marker"
    return hidden


def complete_stages() -> set[str]:
    return {e["stage"] for e in cache.entries() if not e["key"].startswith(".") and manifest.is_complete(Path(e["path"]))}


def test_sigkill_in_every_phase_always_recovers(env, monkeypatch, reference_packages):
    """Builds killed with SIGKILL at moments spread over the whole measured build (and
    in every phase at least once, the last stage and the final copy and rename
    included); after each kill the package is absent or complete, nothing looks
    finished that is not, and the rerun finishes, reusing exactly the stages that
    were complete."""
    pause = 0.15  # the fake stages' test-only slowdown of the final copy and of the rename
    monkeypatch.setenv(fake_stages.PACKAGES_ENV, str(reference_packages["reference-16K"].parent))
    phases = env / "phases.log"
    final = env / "build" / "SmolLM2-135M-Instruct_rai_1.8.0_npu_16K"
    entries_root = cache.cache_root() / "stages"
    validated: set[str] = set()

    def complete_package() -> bool:
        """The package is complete: manifest complete, every file intact, validates (once per manifest)."""
        doc = manifest.read(final)
        if doc is None or not manifest.is_complete(final) or files_not_matching(final, doc):
            return False
        digest = hashlib.sha256((final / manifest.NAME).read_bytes()).hexdigest()
        if digest not in validated and passes(final):
            validated.add(digest)
        return digest in validated

    # one unkilled build, to measure when each phase starts
    assert finish(start_build(env, phases, pause)) == dict.fromkeys(STAGES, "built")
    log = fake_stages.read_phases(phases)
    assert [p for _, p in log] == ["begin", *[x for s in STAGES for x in (s, s + ":commit")], "assemble", "rename", "end"]
    measured = duration = log[-1][0] - log[0][0]
    spans = {p: nxt - t for (t, p), (nxt, _) in zip(log, log[1:])}
    assert complete_package()
    cache.clear()
    shutil.rmtree(env / "build")

    rng = random.Random(7)
    n = 10
    step = 0.98 / (n - 1)
    plan = [("begin", min(1.0, max(0.01, 0.02 + i * step + rng.uniform(-step / 2, step / 2)))) for i in range(n)]
    landed, left = [], set()
    while plan:
        after, fraction = plan.pop(0)
        offset = fraction * (duration if after == "begin" else spans[after])
        phase, log = kill_build(env, phases, pause, after, offset)
        landed.append((after, round(offset, 2), phase))
        if log[-1][1] == "end":  # it ended before the kill: the measured build was slower than this one
            duration = min(duration, log[-1][0] - log[0][0])
        # (a) the package: absent or complete, never partial
        assert not final.exists() or complete_package(), f"killed in {phase}: {final} is not a complete package"
        # (b) nothing in the output or the cache looks finished that is not
        hidden = assert_nothing_looks_finished_that_is_not([env / "build", cache.cache_root()], final.name, entries_root)
        left |= {"stage" if h.startswith(".staging-") else "package" for h in hidden if h.startswith((".staging-", f".{final.name}.staging-"))}
        # (c) the rerun finishes, reusing exactly the stages that were complete
        done = complete_stages()
        statuses = finish(start_build(env))
        assert statuses == {s: "cached" if s in done else "built" for s in STAGES}, f"killed in {phase}; complete before the rerun: {sorted(done)}"
        assert complete_package()
        cache.clear()
        if len(landed) % 2:  # every other kill finds no older package in place
            shutil.rmtree(env / "build")
        missing = [p for p in MUST_COVER if p not in {p for _, _, p in landed}]
        if not plan and missing and len(landed) < n + 2 * len(MUST_COVER):
            # a phase no kill reached yet (a loaded machine shifts them): kill inside it
            plan.append((missing[0], rng.uniform(0.1, 0.9)))
    # (d) the kills covered every stage, the last one included, and the final assemble and rename
    print(f"build {measured:.2f} s (later {duration:.2f} s); kills (after, offset, landed in): {landed}")
    covered = {p for _, _, p in landed}
    assert set(MUST_COVER) <= covered, f"no kill landed in {sorted(set(MUST_COVER) - covered)}: {landed}"
    assert left == {"stage", "package"}, f"the walk met the staging folders of {left} only"  # it saw partial states
