"""`raipack batch` as a use case: load the matrix, pick the executor, run the graph, return the report."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from raipack.batch import report
from raipack.batch.graph import Batch
from raipack.batch.local import LocalExecutor
from raipack.batch.matrix import load
from raipack.builder import cache, staging
from raipack.core.errors import UsageError
from raipack.modelpackage.assemble import assemble_model_packages


def make_executor(kind: str, jobs: int, address: str | None, root: Path, warn: Callable[[str], None], memory_free=None):
    if kind == "ray":
        from raipack.batch.ray_executor import RayExecutor  # late: ray is the cluster extra's, loaded only for the ray executor

        return RayExecutor(address, cache_root=root)
    if address:
        raise UsageError("--address names a Ray cluster, but the executor is local", "add --executor ray, or drop --address")

    return LocalExecutor(jobs, memory_free, warn=warn)


@dataclass(frozen=True)
class BatchOptions:
    """How a batch runs, over what its matrix says."""

    executor: str | None = None  # local | ray (default: the matrix's, else local)
    address: str | None = None  # the Ray cluster
    jobs: int | None = None  # local worker processes (default: the matrix's, else 1)
    line: Callable[[str], None] = print  # one line per job
    warn: Callable[[str], None] = print
    cache_root: Path | None = None
    memory_free: Callable[[], int] | None = None  # the local pool's free-memory probe (tests fake it)
    make: Callable | None = None  # the executor factory (default: make_executor)
    max_entries: int | None = None  # refuse a matrix of more entries (default: limits.json)


def run_batch(matrix_path: Path, options: BatchOptions | None = None, /, **fields) -> dict:
    """Build every entry of the matrix; the report document (pipeline/batch/report.py: document). `fields` set
    BatchOptions' fields over `options`."""
    opts = replace(options or BatchOptions(), **fields)
    executor, address, jobs, line, warn, cache_root = opts.executor, opts.address, opts.jobs, opts.line, opts.warn, opts.cache_root
    memory_free, make, max_entries = opts.memory_free, opts.make, opts.max_entries
    start = time.perf_counter()
    matrix = load(matrix_path, max_entries)  # a bad matrix is refused here: nothing runs
    root = Path(cache_root) if cache_root else cache.cache_root()
    ex = (make or make_executor)(executor or matrix.executor or "local", jobs or matrix.jobs or 1, address, root, warn, memory_free)
    staging.hold(root)
    try:
        staging.sweep_cache(root)
        batch = Batch(matrix.entries, ex, root, on_job=lambda task: line(report.job_line(task)), warn=warn)
        entries = batch.run()
    finally:
        ex.shutdown()
        staging.release(root)
    doc = report.document(str(matrix_path), entries, batch.counts(), time.perf_counter() - start)
    if matrix.model_package.get("assemble"):
        doc["model_packages"] = _model_packages(entries, matrix.output, root)
    return doc


def _model_packages(entries: list[dict], output: Path, root: Path):
    """H9's assembly (pipeline/modelpackage): one multi-variant ONNX Runtime model package per model,
    its CPU variant the export found in this batch's cache."""

    by_model: dict[str, list[dict]] = {}
    for e in entries:
        if e["package"]:
            by_model.setdefault(e["model"], []).append(e)
    return assemble_model_packages(by_model, output, cache_root=root)


def exit_code(doc: dict) -> int:
    """1 when an entry (or a model package) failed, else 0."""
    failed = [e for e in doc["entries"] if e["status"] in ("failed", "skipped")]
    failed += [m for m in (doc.get("model_packages") or {}).values() if m["status"] == "failed"]
    return 1 if failed else 0
