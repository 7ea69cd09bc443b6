"""Tasks: a local task folder checked and copied into a folder raipack owns, and lm-eval run there.

A local task folder holds lm-eval's own YAML task files and their JSONL data (docs/eval.md). It is
read as data by taskfolder.py, and lm-eval gets the folder raipack writes from what it read, never the
input itself; lm-eval runs with that folder as its working folder (it calls `git` there to record a
commit), offline.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

from raipack.core.env import OFFLINE
from raipack.core.errors import UsageError
from raipack.evaluation import taskfolder
from raipack.evaluation.taskfolder import HINT  # noqa: F401  (run.py and chain.py name it through this module)


def check_folder(folder: Path) -> list[Path]:
    """The task files of a local task folder, every file lm-eval would read checked as data (taskfolder.py)."""
    checked = taskfolder.read(folder)
    return [checked.root / t.rel for t in checked.tasks]


@contextlib.contextmanager
def workspace(include_path: Path | None):
    """A fresh folder raipack owns, and a copy of the task folder in it (yields both; the copy is None without one); lm-eval runs
    in the copy (else the fresh folder) as its working folder, offline, and its logging quiet."""

    old_cwd, old_env = os.getcwd(), dict(os.environ)
    quiet = [logging.getLogger(n) for n in ("lm_eval", "lm-eval", "datasets")]
    levels = [lg.level for lg in quiet]
    with tempfile.TemporaryDirectory(prefix="raipack-eval-") as tmp:
        copy = None
        if include_path is not None:
            copy = taskfolder.write(taskfolder.read(include_path), Path(tmp) / "tasks")
        os.environ.update(OFFLINE)
        os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
        os.environ["HF_DATASETS_CACHE"] = str(Path(tmp) / "datasets")  # nothing left behind
        for lg in quiet:
            lg.setLevel(logging.ERROR)
        os.chdir(copy or tmp)  # lm-eval reads relative data_files from the working folder
        try:
            yield Path(tmp), copy
        finally:
            os.chdir(old_cwd)
            os.environ.clear()
            os.environ.update(old_env)
            for lg, level in zip(quiet, levels):
                lg.setLevel(level)


@contextlib.contextmanager
def quiet(log: Path):
    """The libraries' output (progress bars, lm-eval's call of git) into `log`, at the descriptor level."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    with open(log, "a", encoding="utf-8", errors="replace") as sink:
        try:
            for fd in saved:
                os.dup2(sink.fileno(), fd)
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):  # writers that are not the fds
                yield
        finally:
            for stream in (sink, sys.stdout, sys.stderr):
                stream.flush()
            for fd, old in saved.items():
                os.dup2(old, fd)
                os.close(old)


@functools.cache
def registry_names() -> frozenset[str]:
    """The task, group and tag names of lm-eval's own registry (indexed once a process)."""
    from lm_eval.tasks import TaskManager

    return frozenset(TaskManager().all_tasks)


def task_manager(names: list[str], include: Path | None):
    """lm-eval's TaskManager over the (copied) task folder, and its registry when a name is not in the
    folder (indexing the registry reads its thousands of YAML files: seconds); unknown names refused."""
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(include), include_defaults=False) if include else None
    local = set(tm.all_tasks) if tm else set()
    unknown = [n for n in names if n not in local and n not in registry_names()]
    if not unknown and not set(names) <= local:
        tm = TaskManager(include_path=str(include) if include else None)
    if unknown:
        where = "lm-eval's registry" + (" or the task folder" if include else "")
        raise UsageError(f"task {unknown[0]!r} is not in {where}", "name a task of `lm_eval ls tasks`, or a task: of a YAML file in --include-path")
    return tm


def json_safe(results: dict) -> dict:
    """simple_evaluate's dict as plain JSON values (lm-eval's own serializer for the rest)."""
    from lm_eval.utils import handle_non_serializable

    return json.loads(json.dumps(results, default=handle_non_serializable))
