"""Stage jobs (and validations) as Ray tasks: the `ray` executor of `raipack batch` and `raipack validate`.

Each job is one task of `ray.remote(fn)` with the job's resources: `memory` (bytes, the quantize
estimate), `num_cpus`, `num_gpus` (`[quantize] device = "cuda"`) and the custom resources
`ryzenai_sdk` (a node where AMD's model_generate runs) and `npu` (a node with a Ryzen AI NPU), which
a node declares with `ray start --resources='{"ryzenai_sdk": 1}'`. A task whose worker or node died
is retried (`max_retries`); an exception of the job itself is not (a stage that fails fails again).

The cache must be on storage every node sees (NFS, a mounted bucket): `RAIPACK_CACHE` of the driver
(or `cache_root`) is passed to every task, and a stage commits its entry with a rename, so a node
killed mid-stage leaves a staging folder and never a half entry. `ray` is imported here only: the
light install (`raipack validate` without `--executor ray`) never needs it.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from raipack.core.errors import RaipackError, UsageError

CACHE_ENV = "RAIPACK_CACHE"
CUSTOM = ("ryzenai_sdk", "npu")
GIB = 1024**3


class _Refused:
    """A job no node of the cluster can ever take: done at once, its result raises."""

    def __init__(self, error: RaipackError):
        self.error = error


class RayExecutor:
    """submit(fn, arg, resources) -> handle, wait(handles, timeout) -> (done, pending),
    result(handle), shutdown(): the executor protocol of raipack.batch over Ray."""

    def __init__(self, address: str | None = None, *, cache_root: str | Path | None = None, max_retries: int = 3, num_cpus: int | None = None):
        ray = _import_ray()
        self.ray = ray
        self.max_retries = max_retries
        self._remotes: dict = {}
        env = {CACHE_ENV: str(cache_root)} if cache_root else ({CACHE_ENV: os.environ[CACHE_ENV]} if os.environ.get(CACHE_ENV) else {})
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        self._owned = not ray.is_initialized()
        if not self._owned:
            return  # the caller's Ray session (its runtime_env stands)
        options = {"runtime_env": {"env_vars": env}, "logging_level": logging.WARNING, "log_to_driver": False}
        # Ray's workers start in the driver's working folder with it first on sys.path: init from an
        # empty folder of ours, so no module planted in the user's current folder is ever imported.
        self._empty = tempfile.TemporaryDirectory(prefix="raipack-ray-")
        if address:
            probe(address)
        here = os.getcwd()
        self.log = Path(tempfile.gettempdir()) / f"raipack-ray-{os.getpid()}.log"
        try:
            os.chdir(self._empty.name)
            with _stderr_to(self.log):  # Ray's own C++ lines (gcs_client.cc, ...) go to the log, not the terminal
                if address:
                    ray.init(address=address, **options)
                else:  # a Ray of our own for this run, even where RAY_ADDRESS names a cluster
                    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **options)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = f"the Ray cluster at {address}" if address else "a local Ray"
            raise RaipackError(f"cannot start or reach {where}: {_first_line(exc)}",
                               ("start the head node with `ray start --head` and pass its host:port as --address" if address else "check that ray runs here (`ray start --head`)")
                               + f"; Ray's log: {self.log}") from None
        finally:
            os.chdir(here)

    def submit(self, fn, arg, resources: dict | None = None):
        options = task_options(resources or {}, self.max_retries)
        refused = self._infeasible(options)
        if refused:
            return _Refused(RaipackError(refused, "add a node that has it (`ray start --resources=...`), or change the job's settings"))
        remote = self._remotes.get(fn)
        if remote is None:
            remote = self._remotes[fn] = self.ray.remote(fn)
        return remote.options(**options).remote(arg)

    def wait(self, handles, timeout: float | None = None):
        """(done, pending): returns once at least one handle is done, or after `timeout` seconds."""
        refused = [h for h in handles if isinstance(h, _Refused)]
        refs = [h for h in handles if not isinstance(h, _Refused)]
        if refused or not refs:
            return refused, refs
        done, pending = self.ray.wait(refs, num_returns=1, timeout=timeout)
        return list(done), list(pending)

    def result(self, handle):
        """The job's return value; its own error re-raised as itself; a task lost for good as one sentence."""
        if isinstance(handle, _Refused):
            raise handle.error
        ray = self.ray
        try:
            return ray.get(handle)
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            raise (cause if isinstance(cause, BaseException) else RaipackError(_first_line(exc))) from None
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.ObjectLostError,
                ray.exceptions.OwnerDiedError, ray.exceptions.TaskUnschedulableError) as exc:
            raise RaipackError(f"a Ray task was lost after {self.max_retries} retries: {_first_line(exc)}",
                               "check the cluster's nodes (`ray status`); a rerun picks up from the cache") from None

    def shutdown(self) -> None:
        if self._owned and self.ray.is_initialized():
            self.ray.shutdown()
        if self._owned:
            self._empty.cleanup()

    def _infeasible(self, options: dict) -> str | None:
        """A sentence when no live node has the resources the task asks for (Ray would wait forever)."""
        wanted = {"CPU": options.get("num_cpus", 0), "GPU": options.get("num_gpus", 0), "memory": options.get("memory", 0), **options.get("resources", {})}
        nodes = [n.get("Resources", {}) for n in self.ray.nodes() if n.get("Alive")]
        if any(all(res.get(k, 0) >= v for k, v in wanted.items() if v) for res in nodes):
            return None
        asked = ", ".join(f"{k} {v / GIB:.1f} GiB" if k == "memory" else f"{k} {v:g}" for k, v in wanted.items() if v)
        return f"no node of the Ray cluster has what the job asks for ({asked})"


def task_options(resources: dict, max_retries: int) -> dict:
    """Ray's task options from a job's resources {"memory", "num_cpus", "num_gpus", "ryzenai_sdk", "npu"}."""
    options = {"num_cpus": resources.get("num_cpus", 1), "max_retries": max_retries, "retry_exceptions": False}
    if resources.get("memory"):
        options["memory"] = int(resources["memory"])
    if resources.get("num_gpus"):
        options["num_gpus"] = resources["num_gpus"]
    custom = {name: resources[name] for name in CUSTOM if resources.get(name)}
    custom.update(resources.get("custom") or {})
    if custom:
        options["resources"] = custom
    return options


CONNECT_SECONDS = 5.0


def probe(address: str, seconds: float = CONNECT_SECONDS) -> None:
    """A TCP connect to the head's host:port, bounded: Ray's own connect retries for minutes when nothing listens."""
    import socket

    if address == "auto":
        return
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--address {address!r} is not host:port", "give the head node's host:port, e.g. --address 10.0.0.5:6379")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=seconds):
            pass
    except OSError as exc:
        why = f"no answer within {seconds:g} s" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__).lower()
        raise UsageError(f"no Ray cluster at {address} ({why})",
                         "start the head node with `ray start --head` and pass its host:port as --address") from None


class _stderr_to:
    """File descriptor 2 into `path` while the block runs (the C++ side of a library writes there directly)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        import sys

        sys.stderr.flush()
        self.saved = os.dup(2)
        self.sink = open(self.path, "a", encoding="utf-8", errors="replace")
        os.dup2(self.sink.fileno(), 2)

    def __exit__(self, *exc):
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.sink.close()


def _import_ray():
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray needs the ray package, which is not installed",
                         "install raipack's cluster extra (pip install 'raipack[cluster]'), or use --executor local") from None
    return ray


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
