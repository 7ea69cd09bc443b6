"""The local executor of raipack batch: a pool of `jobs` worker processes that admits a job only when its
memory estimate fits what is free.

Admission: a job starts when fewer than `jobs` run and its estimate is at most `memory_free()` minus the
estimates of the jobs already running (psutil's available memory by default). Running jobs' memory is
counted twice while they grow into it (once in their estimate, once as no longer available): this errs
on the side of starting fewer, never more. Among queued jobs the first that fits starts (a small job may
pass a big one that waits for memory). A job larger than the whole machine's free memory runs alone, with a
warning: nothing else runs beside it, and the quantize stage's own check (stages/quantize/memory.py)
then refuses it with its numbers when it cannot fit at all, as `raipack build` does.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent import futures
from concurrent.futures.process import BrokenProcessPool
from typing import Callable

from raipack.core.errors import RaipackError

GIB = 1 << 30


def available_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


class LocalHandle:
    def __init__(self, fn: Callable[[dict], dict], arg: dict, resources: dict):
        self.fn, self.arg = fn, arg
        self.memory = int((resources or {}).get("memory") or 0)
        self.future: futures.Future | None = None


class LocalExecutor:
    """submit(fn, arg, resources) -> handle, wait(handles, timeout) -> (done, pending), result(handle), shutdown()."""

    def __init__(self, jobs: int = 1, memory_free: Callable[[], int] | None = None, *, start_method: str = "spawn",
                 warn: Callable[[str], None] | None = None):
        self.jobs = max(1, int(jobs))
        self.memory_free = memory_free or available_memory
        self.warn = warn or (lambda text: None)
        self._context = multiprocessing.get_context(start_method)
        self._pool = self._new_pool()
        self._queue: list[LocalHandle] = []
        self._running: list[LocalHandle] = []
        self.peak = 0  # the most jobs that ran at once

    def _new_pool(self) -> futures.ProcessPoolExecutor:
        return futures.ProcessPoolExecutor(max_workers=self.jobs, mp_context=self._context)

    def submit(self, fn, arg: dict, resources: dict | None = None) -> LocalHandle:
        handle = LocalHandle(fn, arg, resources or {})
        self._queue.append(handle)
        self._admit()
        return handle

    def wait(self, handles: list, timeout: float | None = None) -> tuple[list, list]:
        """(done, pending) of `handles`: returns once one of them is done, or after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._admit()
            done = [h for h in handles if h.future is not None and h.future.done()]
            left = None if deadline is None else deadline - time.monotonic()
            if done or (left is not None and left <= 0) or not self._running:
                return done, [h for h in handles if h not in done]
            futures.wait([h.future for h in self._running], timeout=left, return_when=futures.FIRST_COMPLETED)

    def result(self, handle: LocalHandle) -> dict:
        """The job's return value, or its exception raised; a worker that died is one sentence."""
        try:
            return handle.future.result()
        except BrokenProcessPool:
            raise RaipackError("a batch worker process died (killed, or out of memory) while it ran this job",
                               "rerun the batch with fewer --jobs; finished stages are picked up from the cache") from None

    def shutdown(self) -> None:
        for h in self._queue:
            h.future = futures.Future()
            h.future.cancel()
        self._queue.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _admit(self) -> None:
        self._running = [h for h in self._running if not h.future.done()]
        while self._queue and len(self._running) < self.jobs:
            handle = self._pick()
            if handle is None:
                return
            self._queue.remove(handle)
            try:
                handle.future = self._pool.submit(handle.fn, handle.arg)
            except BrokenProcessPool:  # a worker died: its jobs failed; later ones get a fresh pool
                self._pool = self._new_pool()
                handle.future = self._pool.submit(handle.fn, handle.arg)
            self._running.append(handle)
            self.peak = max(self.peak, len(self._running))

    def _pick(self) -> LocalHandle | None:
        free = self.memory_free() - sum(h.memory for h in self._running)
        for handle in self._queue:
            if handle.memory <= free:
                return handle
        if self._running:
            return None  # wait for memory
        big = self._queue[0]
        self.warn(f"a job needs about {big.memory / GIB:.1f} GiB, more than the {max(free, 0) / GIB:.1f} GiB free: it runs alone")
        return big
