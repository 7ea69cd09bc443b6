"""A local task folder read as data, and the folder raipack writes from it for lm-eval.

Every file lm-eval would read is read here first with raipack's own loader (taskyaml: no tags, depth and
aliases bounded): each `*.yaml`/`*.yml` of the tree, every file an `include:` names whatever its name, every
data file. Links are followed only when they stay inside the folder; anything else that is not a plain file
or folder (a FIFO, a socket, a device) is refused. Includes are resolved by raipack; the keys are lm-eval's
own (TaskConfig, GroupConfig); metrics, aggregations and filters are names of lm-eval's built-in registry
(a name it does not know makes lm-eval load it as a Hugging Face `evaluate` script); data sets come only
from the packaged builders (a local `dataset_path` folder runs its loading script). What lm-eval then gets
is `write()`'s folder: the resolved task files and copies of their data, nothing else of the input.
The rules are `pipeline/data/eval_tasks.json`; the user's view is docs/security.md.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from raipack.core.errors import UsageError
from raipack.data import load_data
from raipack.evaluation import taskyaml

HINT = "write lm-eval's task format (docs/eval.md: task, dataset_path json, dataset_kwargs.data_files, output_type, doc_to_text, ...)"
CODE_HINT = "raipack runs no code from a task folder: use lm-eval's built-in templates, filters and metrics (docs/security.md)"


def rules() -> dict:
    return load_data("eval_tasks.json")


@dataclass
class Task:
    rel: Path  # where the file lies in the folder
    cfg: dict  # includes resolved, data files as paths relative to the folder
    data: list[Path] = field(default_factory=list)


@dataclass
class Folder:
    root: Path
    tasks: list[Task]


@functools.cache
def _lm_eval_names() -> dict[str, frozenset]:
    import lm_eval.api.metrics
    import lm_eval.filters  # noqa: F401  (registers the built-in filters)
    from lm_eval.api.group import GroupConfig
    from lm_eval.api.registry import aggregation_registry, filter_registry, metric_registry
    from lm_eval.api.task import ALL_OUTPUT_TYPES, TaskConfig

    return {"task_keys": frozenset(f.name for f in dataclasses.fields(TaskConfig)),
            "group_keys": frozenset(f.name for f in dataclasses.fields(GroupConfig)),
            "metrics": frozenset(metric_registry.keys()), "aggregations": frozenset(aggregation_registry.keys()),
            "filters": frozenset(filter_registry.keys()) - set(rules()["refused_filters"]), "output_types": frozenset(ALL_OUTPUT_TYPES)}


def _resolve(root: Path, path: Path, where: str, shown: str | None = None) -> Path:
    """`path` with its links followed, refused when it leaves `root` or is neither a plain file nor a folder."""
    real = Path(os.path.realpath(path))
    path = shown if shown is not None else path
    if not real.is_relative_to(root):
        raise UsageError(f"{where} {path} leads outside the task folder {root}", "keep every task file, include and data file inside the folder (links too)")
    try:
        mode = os.stat(real).st_mode
    except OSError:
        raise UsageError(f"{where} {path} does not exist", HINT) from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise UsageError(f"{where} {path} is not a plain file or folder (a FIFO, socket or device)", "remove it from the task folder")
    return real


def _walk(root: Path) -> list[Path]:
    """The YAML files of the tree (links inside the folder followed, each real folder once)."""
    found, seen, todo = [], set(), [root]
    while todo:
        here = todo.pop()
        if here in seen:
            continue
        seen.add(here)
        for entry in sorted(os.scandir(here), key=lambda e: e.name):
            path = Path(entry.path)
            real = _resolve(root, path, "task folder entry")
            if real.is_dir():
                todo.append(real)
            elif path.suffix in (".yaml", ".yml"):
                found.append(real)
            if len(found) + len(seen) > rules()["max_files"]:
                raise UsageError(f"the task folder {root} holds more than {rules()['max_files']} files and folders", "give a folder with the tasks to run only")
    return sorted(set(found))


def _read(root: Path, path: Path, chain: tuple = ()) -> dict:
    """`path`'s mapping with its includes merged under it (lm-eval's order: includes first, the file's keys win)."""
    if path in chain:
        raise UsageError(f"{path}: include loops back to {chain[0]}", HINT)
    if len(chain) > rules()["max_include_depth"]:
        raise UsageError(f"{path}: includes nest deeper than {rules()['max_include_depth']} files", HINT)
    doc = taskyaml.load(path)
    if not isinstance(doc, dict):
        raise UsageError(f"{path} is not an lm-eval task file: expected a mapping with a task name, got {type(doc).__name__}", HINT)
    if "include" not in doc:
        return doc
    incs = doc.pop("include")
    merged: dict = {}
    for inc in incs if isinstance(incs, list) else [incs]:
        if not isinstance(inc, str):
            raise UsageError(f"{path}: include is {inc!r}; expected a file name relative to this file", HINT)
        target = _resolve(root, path.parent / inc, f"{path}: include", repr(inc))
        if not target.is_file():
            raise UsageError(f"{path}: include {inc!r} is not a file inside the task folder {root}", HINT)
        merged.update(_read(root, target, (*chain, path)))
    merged.update(doc)
    return merged


def _data_files(root: Path, path: Path, cfg: dict) -> list[Path]:
    """The data files a task names, checked inside the folder; `cfg`'s data_files rewritten relative to the root."""
    kwargs = cfg.get("dataset_kwargs")
    if kwargs is None:
        return []
    if not isinstance(kwargs, dict):
        raise UsageError(f"{path}: dataset_kwargs is {type(kwargs).__name__}; expected a mapping", HINT)
    for key in kwargs:
        if key not in rules()["dataset_kwargs"]:
            raise UsageError(f"{path}: dataset_kwargs.{key} is not allowed; expected only {', '.join(rules()['dataset_kwargs'])}", HINT)
    files = kwargs.get("data_files")
    if files is None:
        return []
    shape = files if isinstance(files, dict) else {"": files}
    out, rewritten = [], {}
    for split, rel in shape.items():
        names = rel if isinstance(rel, list) else [rel]
        fld = "dataset_kwargs.data_files" + (f".{split}" if split else "")
        for one in names:
            if not isinstance(one, str):
                raise UsageError(f"{path}: {fld} holds {one!r}; expected file names", HINT)
            real = _resolve(root, path.parent / one, f"{path}: {fld}", repr(one))
            if not real.is_file():
                raise UsageError(f"{path}: {fld} {one!r} is not a file inside the task folder {root}", "keep the JSONL data beside the YAML, named relative to it")
            out.append(real.relative_to(root))
        rewritten[split] = [str(Path("data") / p) for p in out[len(out) - len(names):]]
    kwargs["data_files"] = rewritten[""] if "" in rewritten else rewritten
    return out


def _metric_names(path: Path, cfg: dict, names: dict) -> None:
    for i, m in enumerate(cfg.get("metric_list") or []):
        if not isinstance(m, dict) or not isinstance(m.get("metric"), str):
            raise UsageError(f"{path}: metric_list[{i}] is not a mapping with a metric name", HINT)
        if m["metric"] not in names["metrics"]:
            raise UsageError(f"{path}: metric_list[{i}].metric {m['metric']!r} is not one of lm-eval's built-in metrics ({', '.join(sorted(names['metrics']))})", CODE_HINT)
        agg = m.get("aggregation")
        if agg is not None and agg not in names["aggregations"]:
            raise UsageError(f"{path}: metric_list[{i}].aggregation {agg!r} is not one of lm-eval's built-in aggregations ({', '.join(sorted(names['aggregations']))})", CODE_HINT)
    for i, f in enumerate(cfg.get("filter_list") or []):
        steps = f.get("filter") if isinstance(f, dict) else None
        for j, step in enumerate(steps if isinstance(steps, list) else [None]):
            fn = step.get("function") if isinstance(step, dict) else None
            if fn not in names["filters"]:
                raise UsageError(f"{path}: filter_list[{i}].filter[{j}].function {fn!r} is not one of lm-eval's built-in filters ({', '.join(sorted(names['filters']))})", CODE_HINT)


def _check_task(path: Path, cfg: dict) -> None:
    names = _lm_eval_names()
    for key, why in rules()["code_keys"].items():
        if key in cfg:
            raise UsageError(f"{path}: the key {key!r} {why}", CODE_HINT)
    for key in cfg:
        if key not in names["task_keys"]:
            raise UsageError(f"{path}: the key {key!r} is not one of lm-eval's task keys", HINT)
    if not isinstance(cfg.get("task"), str):
        raise UsageError(f"{path} is not an lm-eval task file: it has no 'task' name (a string)", HINT)
    if cfg.get("unsafe_code"):
        raise UsageError(f"{path}: unsafe_code is set; that task runs generated code", CODE_HINT)
    out = cfg.get("output_type", "generate_until")
    if out not in names["output_types"]:
        raise UsageError(f"{path}: output_type is {out!r}; expected one of {', '.join(sorted(names['output_types']))}", HINT)
    if cfg.get("dataset_path") not in rules()["dataset_builders"]:
        got = "missing" if "dataset_path" not in cfg else repr(cfg["dataset_path"])
        raise UsageError(f"{path}: dataset_path is {got}; expected one of {', '.join(rules()['dataset_builders'])} with dataset_kwargs.data_files in the folder", HINT)
    _metric_names(path, cfg, names)


def _check_group(path: Path, cfg: dict) -> None:
    names = _lm_eval_names()
    for key in cfg:
        if key not in names["group_keys"]:
            raise UsageError(f"{path}: the key {key!r} is not one of lm-eval's group keys", HINT)
    members = cfg.get("task")
    if not isinstance(cfg.get("group"), str) or not isinstance(members, list):
        raise UsageError(f"{path}: a group needs a 'group' name and a 'task' list", HINT)
    for i, m in enumerate(cfg.get("aggregate_metric_list") or []):
        if not isinstance(m, dict) or m.get("aggregation", "mean") not in names["aggregations"]:
            raise UsageError(f"{path}: aggregate_metric_list[{i}] names no built-in aggregation", CODE_HINT)
    for m in members:
        if not isinstance(m, str):
            raise UsageError(f"{path}: a group's task list holds {type(m).__name__}; raipack takes task names (define each task in a file of its own)", HINT)


def read(folder: Path) -> Folder:
    """Every file of the task folder lm-eval would read, checked; one UsageError for the first that is not data."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"--include-path {folder} is not a folder", "give the folder holding the task YAML and JSONL files")
    root = Path(os.path.realpath(folder))
    found = _walk(root)
    if not found:
        raise UsageError(f"--include-path {folder} holds no .yaml task file", HINT)
    docs = {path: _read(root, path) for path in found}
    included = {Path(os.path.realpath(p.parent / inc)) for p in found for inc in _includes(p)}
    tasks = []
    for path, cfg in docs.items():
        if path in included and "task" not in cfg and "group" not in cfg:
            continue  # a base other files include
        if "group" in cfg:
            _check_group(path, cfg)
            tasks.append(Task(path.relative_to(root), cfg))
            continue
        _check_task(path, cfg)
        tasks.append(Task(path.relative_to(root), cfg, _data_files(root, path, cfg)))
    return Folder(root, tasks)


def _includes(path: Path) -> list[str]:
    doc = taskyaml.load(path)
    inc = doc.get("include") if isinstance(doc, dict) else None
    return [i for i in (inc if isinstance(inc, list) else [inc]) if isinstance(i, str)]


def _copy(src: Path, dest: Path) -> None:
    """A plain file copied without following a link swapped in since the check."""
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise UsageError(f"{src} is no longer a plain file", "leave the task folder alone while raipack eval runs")
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "wb") as out:
            while chunk := fh.read(1 << 20):
                out.write(chunk)


def write(checked: Folder, dest: Path) -> Path:
    """The folder lm-eval reads: each task file resolved (no include, data under data/), its data copied."""
    import yaml

    dest.mkdir(parents=True)
    for task in checked.tasks:
        out = dest / task.rel.with_suffix(".yaml")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(yaml.safe_dump(task.cfg, sort_keys=False, allow_unicode=True), "utf-8")
        for rel in task.data:
            if not (dest / "data" / rel).exists():
                _copy(checked.root / rel, dest / "data" / rel)
    return dest
