"""The stage-job graph of a batch, scheduled as it unfolds and deduplicated by cache key.

Each matrix entry is a chain of stages (pipeline/data/stages.json; a model folder stands in for the
source stage). A stage's cache key hashes its input folders' digests, so it is known only once those
inputs are built: when they are, the key is computed (pipeline/batch/jobs.py: job_key) and the job is
submitted — unless a job with that (stage, key) is already pending, running or done in this batch, in
which case the entry attaches to it. One model quantized the same way for two profiles is one quantize
job (the quantize and export stages read no profile key: `profile_keys = ()` in their stage.py).

A failed job fails the entries attached to it; their later stages are skipped; every other entry goes
on. An entry whose chain is done is assembled into its package (pipeline/builder/runner.py:
assemble_package) by this process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from raipack.batch.jobs import Executor, StageJob, job_key, run_stage_job
from raipack.batch.matrix import Entry
from raipack.batch.resources import estimate
from raipack.builder import placing, runner, stages
from raipack.builder.context import BuildContext
from raipack.core.errors import RaipackError
from raipack.npu import profile as profiles


@dataclass
class Task:
    """One submitted stage job, and the entries waiting for it (the first one submitted it)."""

    stage: str
    key: str
    entries: list[str]
    handle: object = None
    result: dict | None = None
    error: str | None = None
    hint: str = ""  # what to do about the error (a RaipackError's hint)
    seconds: float = 0.0


@dataclass
class EntryRun:
    entry: Entry
    todo: list[str]
    outputs: dict[str, Path] = field(default_factory=dict)
    stages: list[dict] = field(default_factory=list)
    results: list[runner.StageResult] = field(default_factory=list)
    status: str = "running"
    error: str | None = None
    hint: str = ""
    package: str | None = None
    started: float = field(default_factory=time.perf_counter)

    def ready(self) -> list[str]:
        """Stages whose inputs are all built and that are not yet submitted or attached."""
        asked = {s["stage"] for s in self.stages}
        return [n for n in self.todo if n not in asked and all(i in self.outputs for i in stages.get(n).inputs)]

    def summary(self) -> dict:
        e = self.entry
        return {"entry": e.id, "model": e.model, "profile": e.profile, "overrides": e.overrides, "status": self.status,
                "package": self.package, "error": self.error, "hint": self.hint, "stages": self.stages}


class Batch:
    """Runs the entries of a matrix on an executor; `on_job(task, entries)` hears of every finished job."""

    def __init__(self, entries: list[Entry], executor: Executor, root: Path, *, force: bool = False,
                 on_job: Callable[[Task], None] | None = None, warn: Callable[[str], None] = print):
        self.runs = {e.id: EntryRun(e, stages.order()) for e in entries}
        self.executor, self.root, self.force = executor, root, force
        self.on_job, self.warn = on_job or (lambda task: None), warn
        self.tasks: dict[tuple[str, str], Task] = {}
        self.pending: dict[object, Task] = {}

    def run(self) -> list[dict]:
        for run in self.runs.values():
            self._start(run)
        while self.pending:
            done, _ = self.executor.wait([t.handle for t in self.pending.values()], None)
            for handle in done:
                self._finish(self.pending.pop(handle))
        return [r.summary() for r in self.runs.values()]

    def counts(self) -> dict[str, int]:
        """Jobs run per stage (after deduplication)."""
        out: dict[str, int] = {}
        for stage, _ in self.tasks:
            out[stage] = out.get(stage, 0) + 1
        return out

    def _start(self, run: EntryRun) -> None:
        if run.entry.source is not None:  # the model folder (checked with the matrix) stands in for the source stage
            model_stage = stages.of_kind(stages.MODEL_KIND)
            run.todo.remove(model_stage)
            run.outputs[model_stage] = run.entry.source
        self._advance(run)

    def _advance(self, run: EntryRun) -> None:
        if run.status != "running":
            return
        if not run.todo:
            self._assemble(run)
            return
        for name in run.ready():
            try:
                job = StageJob(name, run.entry.id, run.entry.recipe, {i: run.outputs[i] for i in stages.get(name).inputs})
                job.key = job_key(job)
                job.resources = estimate(job)
            except (RaipackError, OSError) as exc:
                self._fail(run, name, str(exc))
                return
            self._attach(run, job)

    def _attach(self, run: EntryRun, job: StageJob) -> None:
        task = self.tasks.get((job.stage, job.key))
        run.stages.append({"stage": job.stage, "key": job.key, "status": "pending", "job": f"{job.stage}:{job.key}"})
        if task is None:
            task = self.tasks[(job.stage, job.key)] = Task(job.stage, job.key, [run.entry.id])
            task.handle = self.executor.submit(run_stage_job, job.to_dict(self.root, self.force), job.resources)
            self.pending[task.handle] = task
            return
        task.entries.append(run.entry.id)
        if task.result is not None or task.error is not None:  # done earlier in this batch
            self._deliver(run, task)

    def _finish(self, task: Task) -> None:
        try:
            task.result = self.executor.result(task.handle)
            task.seconds = task.result.get("seconds", 0.0)
        except RaipackError as exc:
            task.error, task.hint = str(exc), exc.hint or ""
        except Exception as exc:  # a crash outside the stage's own sentence (pipeline/builder/crash.py makes those)
            task.error = f"{type(exc).__name__}: {exc}"
        self.on_job(task)
        for entry_id in task.entries:
            self._deliver(self.runs[entry_id], task)

    def _deliver(self, run: EntryRun, task: Task) -> None:
        if task.error is not None:
            self._fail(run, task.stage, task.error, task.hint)
            return
        res = task.result
        first = task.entries[0] == run.entry.id
        record = next(s for s in run.stages if s["stage"] == task.stage)
        record.update(status=res["status"], seconds=round(task.seconds, 2) if first else 0.0, path=res["path"],
                      **({} if first else {"shared_with": task.entries[0]}))
        run.outputs[task.stage] = Path(res["path"])
        run.results.append(runner.StageResult(task.stage, res["status"], res["seconds"], res["key"], res["path"], res["report"]))
        run.todo.remove(task.stage)
        self._advance(run)

    def _fail(self, run: EntryRun, stage: str, error: str, hint: str = "") -> None:
        run.status, run.error, run.hint = "failed", f"{stage}: {error}", hint
        for rec in run.stages:
            if rec["stage"] == stage:
                rec["status"] = "failed"
        run.stages += [{"stage": name, "status": "skipped"} for name in run.todo if name not in {s["stage"] for s in run.stages}]

    def _assemble(self, run: EntryRun) -> None:
        recipe = run.entry.recipe
        try:
            Path(recipe.output).mkdir(parents=True, exist_ok=True)
            ctx = BuildContext(recipe, profiles.get(recipe.profile), self.root, outputs=run.outputs, started=run.started, warn=self.warn)
            package, _ = runner.assemble_package(ctx, run.results)
        except (RaipackError, OSError) as exc:
            self._fail(run, "assemble", str(exc), getattr(exc, "hint", "") or "")
            return
        for r in run.results:
            placing.link_stage_output(Path(recipe.output), package.name, r.name, Path(r.path))
        run.package = str(package)
        run.status = "cached" if all(s["status"] == "cached" for s in run.stages) else "built"
