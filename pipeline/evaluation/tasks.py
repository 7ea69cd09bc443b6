"""Tasks: a local task folder checked and copied into a folder raipack owns, and lm-eval run there.

A local task folder holds lm-eval's own YAML task files and their JSONL data (docs/eval.md). It is
read as data: a `!function` tag or a `class:` key (Python code from the folder) is refused, and so
is a data file or include outside the folder. lm-eval runs with that copy as its working folder
(it calls `git` in the working folder to record a commit), offline.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

from raipack.core.errors import UsageError

HINT = "write lm-eval's task format (docs/eval.md: task, dataset_path json, dataset_kwargs.data_files, output_type, doc_to_text, ...)"


class _Loader(yaml.SafeLoader):
    """Safe YAML that notes lm-eval's `!function` tag instead of importing what it names."""


def _function_tag(loader, node):
    raise UsageError(f"{loader.name}: the tag !function {loader.construct_scalar(node)} would import Python code from the task folder", "raipack runs no code from a task folder: use lm-eval's built-in filters and templates")


_Loader.add_constructor("!function", _function_tag)


def _read(path: Path) -> dict:
    try:
        doc = yaml.load(path.read_text("utf-8"), Loader=_Loader)  # a SafeLoader subclass
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"{path} is not a readable YAML file ({str(exc).splitlines()[0]})", HINT) from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path} is not an lm-eval task file: expected a mapping with a task name, got {type(doc).__name__}", HINT)
    return doc


def _inside(folder: Path, rel: str, path: Path, field: str) -> None:
    target = (path.parent / rel).resolve()
    if not target.is_relative_to(folder.resolve()) or not target.is_file():
        raise UsageError(f"{path}: {field} {rel!r} is not a file inside the task folder {folder}", "keep the JSONL data beside the YAML, named relative to it")


def check_task_file(path: Path, folder: Path) -> None:
    """One sentence for the first thing in `path` that is not lm-eval's task format."""
    from lm_eval.api.task import ALL_OUTPUT_TYPES

    doc = _read(path)
    if "class" in doc:
        raise UsageError(f"{path}: the key 'class' names a Python task class", "raipack runs no code from a task folder: describe the task in YAML")
    for inc in (doc.get("include") if isinstance(doc.get("include"), list) else [doc["include"]] if "include" in doc else []):
        _inside(folder, str(inc), path, "include")
    if "include" in doc:
        return  # the included file carries the rest
    if not isinstance(doc.get("task"), str) and "group" not in doc:
        raise UsageError(f"{path} is not an lm-eval task file: it has no 'task' name (a string)", HINT)
    if "group" in doc:
        return
    out = doc.get("output_type", "generate_until")
    if out not in ALL_OUTPUT_TYPES:
        raise UsageError(f"{path}: output_type is {out!r}; expected one of {', '.join(ALL_OUTPUT_TYPES)}", HINT)
    if not isinstance(doc.get("dataset_path"), str):
        raise UsageError(f"{path}: dataset_path is missing; expected the data set (json for a local JSONL file)", HINT)
    files = (doc.get("dataset_kwargs") or {}).get("data_files") if isinstance(doc.get("dataset_kwargs"), dict) else None
    for split, rel in (files.items() if isinstance(files, dict) else []):
        for one in rel if isinstance(rel, list) else [rel]:
            _inside(folder, str(one), path, f"dataset_kwargs.data_files.{split}")


def check_folder(folder: Path) -> list[Path]:
    """The YAML task files of a local task folder, each checked."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"--include-path {folder} is not a folder", "give the folder holding the task YAML and JSONL files")
    found = sorted(p for p in folder.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
    if not found:
        raise UsageError(f"--include-path {folder} holds no .yaml task file", HINT)
    for path in found:
        check_task_file(path, folder)
    return found


@contextlib.contextmanager
def workspace(include_path: Path | None):
    """A fresh folder raipack owns, and a copy of the task folder in it (yields both; the copy is None without one); lm-eval runs
    in the copy (else the fresh folder) as its working folder, offline, and its logging quiet."""
    from raipack.core.env import OFFLINE

    old_cwd, old_env = os.getcwd(), dict(os.environ)
    quiet = [logging.getLogger(n) for n in ("lm_eval", "lm-eval", "datasets")]
    levels = [lg.level for lg in quiet]
    with tempfile.TemporaryDirectory(prefix="raipack-eval-") as tmp:
        copy = None
        if include_path is not None:
            copy = Path(tmp) / "tasks"
            shutil.copytree(include_path, copy, symlinks=False)
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
def sandboxed_templates():
    """lm-eval renders a task's Jinja templates (doc_to_text, doc_to_choice, ...) with a plain jinja2 Environment
    (`lm_eval.utils.env`), where a template can reach Python objects and run code. A task folder is input: its
    templates are rendered in jinja2's immutable sandbox instead, with lm-eval's one filter."""
    from jinja2 import BaseLoader, StrictUndefined
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from lm_eval import utils

    sandbox = ImmutableSandboxedEnvironment(loader=BaseLoader, undefined=StrictUndefined, keep_trailing_newline=True)
    sandbox.filters["regex_replace"] = utils.regex_replace
    saved, utils.env = utils.env, sandbox
    try:
        yield
    finally:
        utils.env = saved


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
