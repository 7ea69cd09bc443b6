"""What libraries say while a stage runs goes to the stage's `log.txt`, not the build's output.

The build prints raipack's own lines only (stage lines, progress, one-sentence warnings).
While a stage runs, everything else — Python `logging` of other libraries, `warnings`,
prints, and what C extensions write straight to file descriptors 1 and 2 — is redirected
at the descriptor level to `log.txt` in the stage's output folder (`job.workdir`, so it is
part of the cache entry and of build/<package>.stages/<stage>). The stage line names the
file when something was logged; `--verbose` also shows the lines live. If the stage fails,
its log is kept beside the crash traceback, in build/<package>.stages/<stage>.log.txt.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

from raipack.builder.naming import package_name

LOG_NAME = "log.txt"
FDS = (1, 2)


@contextmanager
def captured(job):
    """Run the body with fds 1/2, sys.stdout/sys.stderr and `warnings` going to the stage's log."""
    progress = job.progress
    with tempfile.TemporaryFile(buffering=0, dir=job.workdir.parent) as sink:  # anonymous: a killed build leaves nothing
        failed = False
        try:
            with _redirected(sink, progress, getattr(progress, "verbose", False)):
                yield
        except BaseException:
            failed = True
            raise
        finally:
            if sink.seek(0, os.SEEK_END):
                _keep(sink, job, failed)


def _keep(sink, job, failed: bool) -> None:
    stages_dir = _stages_dir(job)
    target = stages_dir / f"{job.stage.name}.log.txt" if failed else job.workdir / LOG_NAME
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        sink.seek(0)
        with open(target, "wb") as out:
            shutil.copyfileobj(sink, out)
    except OSError as exc:
        job.progress.line(f"  warning: the libraries' output could not be kept in {target} ({exc.strerror or exc})", "yellow")
        return
    if failed:
        job.progress.line(f"  the libraries' output of {job.stage.name} is in {_shown(target)}", "yellow")
    else:
        job.progress.logged(job.stage.name, _shown(stages_dir / job.stage.name / LOG_NAME))


def _stages_dir(job) -> Path:
    """build/<package>.stages, where the runner links each stage's output."""
    return Path(job.recipe.output) / f"{package_name(job.recipe, job.profile)}.stages"


def _shown(path: Path) -> str:
    try:
        return str(path.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


@contextmanager
def _redirected(sink, progress, verbose: bool):
    _flush()
    saved = {fd: os.dup(fd) for fd in FDS}
    terminal = os.fdopen(os.dup(saved[2]), "w", buffering=1, encoding="utf-8", errors="replace")
    tee = _Tee(sink.fileno(), saved[2]) if verbose else None
    target = tee.write_end if tee else sink.fileno()
    try:
        for fd in FDS:
            os.dup2(target, fd)
        # Python-level writers too, in case sys.stdout/sys.stderr are not the fds themselves
        with open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False) as py, \
                redirect_stdout(py), redirect_stderr(py), progress.writing_to(terminal):
            yield
    finally:
        _flush()
        for fd in FDS:
            os.dup2(saved[fd], fd)
            os.close(saved[fd])
        if tee:
            tee.close()
        terminal.close()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass


class _Tee:
    """`--verbose`: a pipe whose bytes go both to the log and to the terminal."""

    def __init__(self, log_fd: int, terminal_fd: int):
        read_end, self.write_end = os.pipe()
        # the thread owns its descriptors: a child of the stage holding the pipe past close() never
        # makes it write to a descriptor number reused by then
        self._thread = threading.Thread(target=_pump, args=(read_end, (os.dup(log_fd), os.dup(terminal_fd))),
                                        name="raipack-log-tee", daemon=True)
        self._thread.start()

    def close(self) -> None:
        os.close(self.write_end)
        self._thread.join(timeout=5)


def _pump(read_end: int, outs: tuple[int, ...]) -> None:
    try:
        while chunk := os.read(read_end, 65536):
            for fd in outs:
                view = memoryview(chunk)
                try:
                    while view:
                        view = view[os.write(fd, view):]
                except OSError:
                    pass
    finally:
        for fd in (read_end, *outs):
            os.close(fd)
