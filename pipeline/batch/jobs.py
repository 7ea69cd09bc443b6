"""The unit of work of a batch: one stage of one recipe (StageJob), run by any executor through
`run_stage_job`, a plain top-level function over a JSON-safe dict (picklable for a process pool,
serialisable for a Ray task).

The stage runs with the runner's own code (pipeline/builder/runner.py: run_stage), into the shared
content-addressed cache: a key already committed is a hit, and two workers building one key at once end
with one entry (pipeline/builder/cache.py: committing).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from raipack.builder import cache, runner, stages, staging
from raipack.builder.config import parse_config
from raipack.builder.context import BuildContext
from raipack.builder.recipe import Recipe
from raipack.npu import profile as profiles


def default_resources() -> dict[str, int]:
    return {"memory": 0, "num_cpus": 1, "num_gpus": 0, "ryzenai_sdk": 0, "npu": 0}


@dataclass
class StageJob:
    """One stage of one matrix entry's recipe. `key` is None until its inputs are built (it hashes their digests)."""

    stage: str
    entry: str
    recipe: Recipe
    inputs: dict[str, Path] = field(default_factory=dict)
    key: str | None = None
    resources: dict[str, int] = field(default_factory=default_resources)

    def to_dict(self, cache_root: Path | None = None, force: bool = False) -> dict[str, Any]:
        """What `run_stage_job` takes: JSON-safe (the recipe as a dict, paths as strings)."""
        return {"stage": self.stage, "entry": self.entry, "key": self.key, "recipe": dataclasses.asdict(self.recipe),
                "inputs": {k: str(v) for k, v in self.inputs.items()}, "cache_root": str(cache_root) if cache_root else None,
                "force": force}


def run_stage_job(job: dict) -> dict:
    """Run one stage job (a `StageJob.to_dict()`) and return {"stage", "key", "path", "status": "built"|"cached",
    "report", "seconds"}. A user error raises RaipackError, as in `raipack build`."""
    recipe = Recipe(**job["recipe"])
    st = stages.get(job["stage"])
    profile = profiles.get(recipe.profile)
    outputs = {name: Path(p) for name, p in job["inputs"].items()}
    reports = {name: runner.stored_report(p) for name, p in outputs.items()}
    root = Path(job["cache_root"]) if job.get("cache_root") else cache.cache_root()
    staging.hold(root)  # this process is a live writer of the cache: no sweep takes its staging folder
    try:
        ctx = BuildContext(recipe, profile, root, outputs=outputs, reports=reports)  # quiet progress: the batch prints its own lines
        res = runner.run_stage(st, ctx, force=bool(job.get("force")))
    finally:
        staging.release(root)
    return {"stage": res.name, "key": res.key, "path": res.path, "status": res.status, "report": res.report, "seconds": round(res.seconds, 3)}


def job_key(job: StageJob) -> str:
    """The cache key `job` will have, from its recipe and (finished) input folders, without running anything."""
    st = stages.get(job.stage)
    cfg = parse_config(st.config, job.recipe.stages.get(job.stage), f"[{job.stage}]")
    return runner.stage_key(st, cfg, profiles.get(job.recipe.profile), job.inputs)


class Executor(Protocol):
    """Runs `fn(arg)` somewhere: a local process (pipeline/batch/local.py), a Ray task (pipeline/batch/ray_executor.py)."""

    def submit(self, fn: Callable[[dict], dict], arg: dict, resources: dict[str, int]) -> Any: ...

    def wait(self, handles: list, timeout: float | None = None) -> tuple[list, list]: ...

    def result(self, handle) -> dict: ...

    def shutdown(self) -> None: ...
