"""Small helpers the tests share: editing generated packages, the in-process CLI, building a
shared fixture once under a file lock."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import NamedTuple

import pytest


def edit_json(path: Path, fn) -> None:
    doc = json.loads(Path(path).read_text())
    result = fn(doc)
    Path(path).write_text(json.dumps(doc if result is None else result, indent=2))


def ryzen(doc: dict) -> dict:
    """The RyzenAI options block of a 1.7+ genai_config (for editing)."""
    return doc["model"]["decoder"]["session_options"]["provider_options"][0]["RyzenAI"]


def ids(result) -> set[str]:
    return {f.check_id for f in result.findings if f.severity == "error"}


def open_in_chromium(page: Path, out: Path) -> tuple[Path, str, list[str]]:
    """Open `page` in Debian's headless chromium once: (screenshot, the DOM after load, the console lines).

    `make test` installs chromium when missing; without it this fails, unless RAIPACK_NO_BROWSER=1 says to skip."""
    from tiers import refuse_in_quick_tier

    refuse_in_quick_tier("open_in_chromium (tests/helpers.py)")
    exe = shutil.which("chromium")
    if exe is None:
        if os.environ.get("RAIPACK_NO_BROWSER") == "1":
            pytest.skip("chromium is not installed and RAIPACK_NO_BROWSER=1: the report was not opened in a browser")
        pytest.fail("chromium is not installed: run `make chromium` (apt-get install chromium), or set RAIPACK_NO_BROWSER=1 to skip this test")
    shot = out / f"{page.stem}.png"
    run = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={out / 'profile'}", "--enable-logging=stderr", "--v=0",
                          f"--screenshot={shot}", "--window-size=1280,2400", "--dump-dom", page.resolve().as_uri()],
                         capture_output=True, text=True, timeout=60, cwd=out)
    assert run.returncode == 0, run.stderr[-2000:]
    return shot, run.stdout, [x for x in run.stderr.splitlines() if ":CONSOLE" in x]


class Ran(NamedTuple):
    code: int | str | None
    out: str
    err: str


def run_cli(capsys, *args) -> Ran:
    """`raipack ARGS` in this process, through main() (the error sentence and the exit code): (exit
    code, stdout, stderr). With capsys None the output is captured here, for fixtures wider than a
    test, which cannot take capsys. The one in-process runner of the tests."""
    from raipack.cli import main

    argv = list(map(str, args))
    if capsys is None:
        out, err = io.StringIO(), io.StringIO()
        with pytest.raises(SystemExit) as info, redirect_stdout(out), redirect_stderr(err):
            main(argv)
        return Ran(info.value.code, out.getvalue(), err.getvalue())
    with pytest.raises(SystemExit) as info:
        main(argv)
    captured = capsys.readouterr()
    return Ran(info.value.code, captured.out, captured.err)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive flock on `path` (created, with its folder) while the block runs: one process at a
    time across the pytest-xdist workers and their children; the kernel drops it when its holder dies."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def build_once(folder: Path, build: Callable[[Path], object]) -> Path:
    """`folder`, built by `build(partial)` into a partial folder the first time any process asks, then
    renamed into place: it exists only complete. The other processes wait on `<folder>.lock` and reuse
    it; a build killed midway leaves only the partial folder, which the next one removes first."""
    folder = Path(folder)
    with locked(folder.parent / f"{folder.name}.lock"):
        if not folder.is_dir():
            partial = folder.parent / f".{folder.name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            build(partial)
            os.rename(partial, folder)
    return folder


# ------------------------------------------------------------------------------ fake builds


def fake_build_env(tmp_path: Path, monkeypatch) -> Path:
    """A build with the fake stages (tests/fake_stages.py) in `tmp_path`, its cache below it; the
    body of the tests' `env` fixtures. Returns `tmp_path`."""
    import fake_stages

    monkeypatch.setenv("RAIPACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fake_stages, "CALLS", tmp_path / "calls.txt")
    monkeypatch.setattr("raipack.builder.stages.get", fake_stages.FAKES.__getitem__)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_fake_build(**kw) -> tuple[dict[str, str], str]:
    """A fake build into ./build: its stage statuses and what it printed."""
    from raipack.builder.progress import Progress
    from raipack.builder.recipe import load
    from raipack.builder.runner import build

    out = io.StringIO()
    result = build(load(None, {"output": "build"}), progress=Progress("plain", stream=out), **kw)
    return {s.name: s.status for s in result.stages}, out.getvalue()


def fuse_entry() -> Path:
    """The one complete cache entry of the fuse stage."""
    from raipack.builder import cache

    (entry,) = [Path(e["path"]) for e in cache.entries() if e["stage"] == "fuse" and e["complete"]]
    return entry
