"""`raipack eval TARGET`: lm-eval's simple_evaluate on one target; its results dict plus a "raipack" key.

With `numerics="bfp16"` a package is scored twice, float and BFP16 (pipeline/runtime/numerics.py),
and the "raipack" key holds both rows side by side with the drop from float to BFP16. Unset (None), a package
is scored under its device's numerics (evaluation/targets.py device_numerics: bfp16 for NPU and hybrid
packages, so both rows), every other target in float."""

from __future__ import annotations

import contextlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from raipack.core.errors import RaipackError, UsageError
from raipack.evaluation import loadcheck
from raipack.evaluation import tasks as local_tasks
from raipack.evaluation.targets import Target, detect_target, device_numerics
from raipack.runtime.numerics import HONEST, ready

BOOTSTRAP_ITERS = 1000  # lm-eval's stderr of non-mean metrics (perplexities); its default 100000 takes seconds a task


@dataclass
class Request:
    tasks: list[str]
    limit: int | None = None
    num_fewshot: int | None = None
    include_path: Path | None = None
    numerics: str | None = None  # "bfp16": packages are scored under float and under BFP16; None: the device's (bfp16 for NPU packages)


def parse_tasks(text: str) -> list[str]:
    names = [t.strip() for t in str(text).split(",") if t.strip()]
    if not names:
        raise UsageError("--tasks names no task", "give task names separated by commas, e.g. --tasks arc_easy,hellaswag")
    return names


def check_output(path: Path | None) -> None:
    """--output names a file in an existing folder (checked before the minutes of evaluation)."""
    if path is not None and (Path(path).is_dir() or not Path(path).resolve().parent.is_dir()):
        raise UsageError(f"--output {path} is a folder or lies in a folder that does not exist", "give a file name in an existing folder")


def require_lm_eval() -> None:
    if importlib.util.find_spec("lm_eval") is None:
        raise UsageError("lm-eval is not installed", "install raipack's eval extra (lm-eval 0.4.13 or a later 0.4)")


def check_request(req: Request) -> Request:
    """Absolute paths (lm-eval runs in its own folder) and the task folder checked, before any model loads."""
    require_lm_eval()
    ready([req.numerics] if req.numerics else [])
    include = Path(req.include_path).resolve() if req.include_path else None
    if include is not None:
        local_tasks.check_folder(include)
    if req.limit is not None and req.limit < 1:
        raise UsageError(f"--limit is {req.limit}; expected a positive number of documents", "drop --limit to run every document")
    return Request(list(req.tasks), req.limit, req.num_fewshot, include, req.numerics)


class Session:
    """lm-eval's tasks, ready in a folder raipack owns; `run(target)` evaluates one target on them."""

    def __init__(self, req: Request, include_copy: Path | None, log: Path):
        self.req, self.log = req, log
        if include_copy is not None:  # lm-eval's loading of the written folder, bounded in a child first
            loadcheck.check(include_copy, req.tasks, log)
        self.manager = local_tasks.task_manager(req.tasks, include_copy)

    def run(self, target: Target, lm=None, numerics: str = "float") -> dict:
        from jinja2.exceptions import SecurityError  # late, with the imports below: lm-eval, torch and onnxruntime load when a run starts (1.3 s)
        from lm_eval import simple_evaluate

        # late: lm-eval, torch and onnxruntime load when a run starts (1.3 s), see the jinja2 import above
        from raipack.evaluation.backends import open_backend
        from raipack.evaluation.lm import RaipackLM  # late: as above
        from raipack.evaluation.templates import sandboxed_templates  # late: as above
        from raipack.runtime.chat import load_tokenizer  # late: as above
        from raipack.runtime.reference import RuntimeRefusal  # late: as above

        with local_tasks.quiet(self.log):  # the libraries' progress bars and logs, loading included
            if lm is None:
                lm = RaipackLM(open_backend(target, numerics), load_tokenizer(target.path))
            try:
                with sandboxed_templates():
                    results = simple_evaluate(model=lm, tasks=self.req.tasks, num_fewshot=self.req.num_fewshot, limit=self.req.limit,
                                              task_manager=self.manager, log_samples=False, bootstrap_iters=BOOTSTRAP_ITERS)
            except RuntimeRefusal as exc:
                raise RaipackError(f"{target.path} cannot serve a request of tasks {', '.join(self.req.tasks)}: {exc}",
                                   "lower --num-fewshot, or use a package with a longer prompt limit") from None
            except SecurityError as exc:  # a template that reached for Python objects or past its budget (templates.py)
                raise UsageError(f"a template of tasks {', '.join(self.req.tasks)} is not allowed: {exc}", local_tasks.HINT) from None
            except (ValueError, KeyError, FileNotFoundError) as exc:  # a task file lm-eval cannot build, a data file it cannot read
                raise UsageError(f"lm-eval cannot run tasks {', '.join(self.req.tasks)}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                                 local_tasks.HINT) from None
        if results is None:
            raise RaipackError("lm-eval returned no results", "run again with --limit to check the tasks")
        doc = local_tasks.json_safe(results)
        doc["raipack"] = {"target": str(target.path), "kind": target.kind, "ran_on": lm.backend.ran_on, "numerics": numerics}
        return doc


@contextlib.contextmanager
def session(req: Request):
    req = check_request(req)
    with local_tasks.workspace(req.include_path) as (root, copy):
        yield Session(req, copy, root / "lm-eval.log")


def evaluate(path: Path, req: Request) -> dict:
    """lm-eval's results for the target at `path` (its kind detected)."""
    target = detect_target(Path(path).resolve())
    if req.numerics is None:  # the device's numerics: a package of an NPU target is scored as the NPU computes
        numerics, why = device_numerics(target.path) if target.kind == "package" else ("float", "")
        req = Request(req.tasks, req.limit, req.num_fewshot, req.include_path, numerics)
        doc = evaluate(target.path, req)
        if why:
            doc["raipack"]["numerics_skipped"] = why
        return doc
    if req.numerics != "float" and target.kind != "package":
        article = "an" if target.kind[0] in "aeiou" else "a"
        raise UsageError(f"--numerics {req.numerics} applies to packages, and {target.path} is {article} {target.kind} folder",
                         "give the package folder, or drop --numerics")
    with session(req) as s:
        if req.numerics == "float":
            return s.run(target)
        return side_by_side([s.run(target), s.run(target, numerics=req.numerics)])


def _metrics(results: dict) -> dict[tuple[str, str], float]:
    out = {}
    for task, res in results.get("results", {}).items():
        for key, value in res.items():
            if "_stderr" in key or "," not in key or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            out[(task, key)] = float(value)
    return out


def drops(rows: list[dict]) -> list[dict]:
    """Adds to each stage row `drop` {task: {metric: {value, vs_source, vs_previous}}}."""
    first = _metrics(rows[0]["results"])
    prev = first
    for row in rows:
        now = _metrics(row["results"])
        better = {t: hib for t, hib in row["results"].get("higher_is_better", {}).items()}
        row["drop"] = {}
        for (task, key), value in now.items():
            up = better.get(task, {}).get(key.split(",")[0], True)
            sign = 1.0 if up else -1.0
            row["drop"].setdefault(task, {})[key] = {
                "value": value,
                "vs_source": round(sign * (first.get((task, key), value) - value), 6),
                "vs_previous": round(sign * (prev.get((task, key), value) - value), 6)}
        prev = now
    return rows


def side_by_side(docs: list[dict]) -> dict:
    """One package's float and BFP16 results: the float run in lm-eval's format, and under "raipack"
    a row per numerics with the drop from float (worse is positive)."""
    rows = drops([{"results": d} for d in docs])
    doc = dict(docs[0])
    doc["raipack"] = dict(docs[0]["raipack"], numerics=[d["raipack"]["numerics"] for d in docs], note=HONEST,
                          rows=[{"numerics": d["raipack"]["numerics"], "ran_on": d["raipack"]["ran_on"], "results": d["results"], "drop": r["drop"]}
                                for d, r in zip(docs, rows)])
    return doc


def numerics_table(doc: dict) -> str:
    """task, metric, the value under each numerics, and the drop from float to the last one."""
    rows = doc["raipack"]["rows"]
    names = [r["numerics"] for r in rows]
    lines = [f"{'task':<24} {'metric':<20} " + " ".join(f"{n:>10}" for n in names) + f" {'drop':>10}"]
    for task, metrics in sorted(rows[-1]["drop"].items()):
        for key, d in metrics.items():
            values = [r["drop"].get(task, {}).get(key, {}).get("value") for r in rows]
            lines.append(f"{task:<24} {key.split(',')[0]:<20} " + " ".join(f"{v:>10.4f}" if v is not None else f"{'':>10}" for v in values) + f" {d['vs_source']:>10.4f}")
    return "\n".join(lines + [f"note: {doc['raipack']['note']}"])


def table(doc: dict) -> str:
    """task, metric, value, stderr: one line per metric of lm-eval's results."""
    lines = [f"{'task':<24} {'metric':<20} {'value':>10} {'stderr':>10}"]
    for task, res in sorted(doc.get("results", {}).items()):
        for key, value in res.items():
            metric, _, filt = key.partition(",")
            if "_stderr" in metric or not isinstance(value, (int, float)) or isinstance(value, bool) or key == "sample_len":
                continue
            err = res.get(f"{metric}_stderr,{filt}")
            err_text = f"{err:.4f}" if isinstance(err, (int, float)) else ""
            lines.append(f"{task:<24} {metric:<20} {value:>10.4f} {err_text:>10}")
    return "\n".join(lines)
