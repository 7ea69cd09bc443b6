"""Fast stand-in stages for runner tests: real stage objects whose run() writes
generated packages (tests/factory.py) slowly enough to be killed mid-write.

When $RAIPACK_FAKE_PHASES names a file, the build appends one line per phase it
enters (`<monotonic seconds> <phase>`): `<stage>` when a stage starts writing,
`<stage>:commit` when it returns (the runner then checks and commits it),
`assemble` when the package is assembled and `rename` when it is swapped into
place. A process killed at any moment has the phase it died in as its last
line. $RAIPACK_FAKE_PAUSE (seconds) slows the package copy and the rename down
by that much each, so a kill can land there; $RAIPACK_FAKE_NO_DELAY=1 skips the
configured delays (a rerun that only has to finish); production code reads none.
$RAIPACK_FAKE_PACKAGES names a folder of ready packages, one per profile id
(factory.reference_package's parent), copied instead of asking the factory: a
subprocess then never builds the real reference packages itself.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from factory import make_package
from raipack.builder import stages as stage_mod
from raipack.core.stage import Stage

CALLS = Path(os.environ.get("RAIPACK_FAKE_CALLS", "/dev/null"))
PHASES_ENV = "RAIPACK_FAKE_PHASES"
PAUSE_ENV = "RAIPACK_FAKE_PAUSE"
NO_DELAY_ENV = "RAIPACK_FAKE_NO_DELAY"
PACKAGES_ENV = "RAIPACK_FAKE_PACKAGES"


@dataclass(frozen=True)
class FakeConfig:
    delay: float = 0.0  # seconds per file written
    seconds: float = 0.0  # seconds for the whole write, spread over its files
    fail: bool = False


def log_phase(phase: str) -> None:
    path = os.environ.get(PHASES_ENV)
    if path:
        with open(path, "a") as fh:
            fh.write(f"{time.monotonic():.6f} {phase}\n")


def read_phases(path: Path) -> list[tuple[float, str]]:
    """The (time, phase) lines a build wrote, complete lines only."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines(keepends=True):
        if line.endswith("\n") and " " in line:
            t, phase = line.split()
            out.append((float(t), phase))
    return out


def _sleep(seconds: float) -> None:
    if os.environ.get(NO_DELAY_ENV) != "1":
        time.sleep(seconds)


def _writer(profile_id: str | None):
    """A stage writing a package of `profile_id`, or (None) a report as the smoke stage does."""
    def run(job):
        log_phase(job.stage.name)
        with open(CALLS, "a") as fh:
            fh.write(job.stage.name + "\n")
        if profile_id is None:
            _sleep(job.config.delay + job.config.seconds)
            (job.workdir / f"{job.stage.name}.json").write_text(json.dumps({"device": "fake"}) + "\n")
            log_phase(job.stage.name + ":commit")
            return {"summary": f"fake {job.stage.name}", "inputs": sorted(job.inputs)}
        tmp = Path(tempfile.mkdtemp(prefix=f"raipack-fake-{job.stage.name}-"))
        try:  # removed when the stage fails too (only a killed stage leaves it)
            ready = Path(os.environ.get(PACKAGES_ENV) or "/nonexistent") / profile_id
            pkg = shutil.copytree(ready, tmp / "x") if ready.is_dir() else make_package(tmp, profile_id, name="x")
            (pkg / "manifest.json").unlink(missing_ok=True)
            items = sorted(pkg.iterdir())
            for item in items:
                _sleep(job.config.delay + job.config.seconds / len(items))
                shutil.move(str(item), job.workdir / item.name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if job.config.fail:
            (job.workdir / "model.onnx").write_bytes(b"broken")
        log_phase(job.stage.name + ":commit")
        return {"summary": f"fake {job.stage.name}", "inputs": sorted(job.inputs)}
    return run


FAKES = {
    "source": Stage("source", "1", FakeConfig, (), lambda j: "hf-source", _writer("hf-source"), kind="source"),
    "quantize": Stage("quantize", "1", FakeConfig, ("source",), lambda j: "quark-export", _writer("quark-export"), kind="quark"),
    "export": Stage("export", "1", FakeConfig, ("quantize",), lambda j: "oga-export", _writer("oga-export"), kind="oga"),
    "fuse": Stage("fuse", "1", FakeConfig, ("export",), lambda j: "reference-16K", _writer("reference-16K"), kind="package"),
    "smoke": Stage("smoke", "1", FakeConfig, ("fuse",), lambda j: None, _writer(None), kind="smoke"),
}


def install() -> None:
    """Use the fake stages in this process, and log (and slow down) the runner's
    final assemble and rename phases as described above."""
    stage_mod.get = FAKES.__getitem__
    from raipack.builder import runner, swap

    pause = float(os.environ.get(PAUSE_ENV) or 0)
    real_assemble, real_replace, real_copytree = runner._assemble, swap.replace_dir, shutil.copytree
    assembling = []

    def assemble(*args, **kw):
        log_phase("assemble")
        assembling.append(True)
        try:
            return real_assemble(*args, **kw)
        finally:
            assembling.pop()

    def copytree(src, dst, *args, **kw):
        if len(assembling) != 1 or not pause or "copy_function" not in kw:  # subfolders: already slowed
            return real_copytree(src, dst, *args, **kw)
        copy = kw["copy_function"]
        each = pause / max(1, sum(1 for p in Path(src).rglob("*") if p.is_file()))

        def slow_copy(s, d):
            time.sleep(each)
            return copy(s, d)
        assembling.append(True)
        try:
            return real_copytree(src, dst, *args, **{**kw, "copy_function": slow_copy})
        finally:
            assembling.pop()

    def replace_dir(*args, **kw):
        log_phase("rename")
        time.sleep(pause)
        return real_replace(*args, **kw)

    runner._assemble, swap.replace_dir, shutil.copytree = assemble, replace_dir, copytree


def use_in_test(tmp_path: Path, monkeypatch) -> Path:
    """The fake stages for one test, in-process: its own cache and call log under `tmp_path`, which becomes the cwd."""
    monkeypatch.setenv("RAIPACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("RAIPACK_FAKE_CALLS", str(tmp_path / "calls.txt"))
    monkeypatch.setattr(sys.modules[__name__], "CALLS", tmp_path / "calls.txt")
    monkeypatch.setattr("raipack.builder.stages.get", FAKES.__getitem__)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def calls_in(folder: Path) -> list[str]:
    """The stages the fakes ran, in order (use_in_test's log)."""
    p = folder / "calls.txt"
    return p.read_text().split() if p.exists() else []
