"""The Ray executor on a REAL two-node Ray cluster on 127.0.0.1: `ray start --head` and a second node
`ray start --address`, each with its own temp folder and process group, stopped by this module only (never
a bare `ray stop`, which would stop every Ray on the machine).

A matrix of 3 models x 2 profiles (fake stages, tests/fake_stages.py) builds with 3 quantize jobs, not 6;
the worker node is killed while it runs a quantize job, and the batch still ends with every package built
and valid and no half entry in the cache. `raipack validate --executor ray --address` checks a zoo on the
same cluster without importing anything from the current folder."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import fake_stages
from factory import make_package, reference_package
from raipack.builder import stages as stage_mod
from raipack.core import manifest
from raipack.core.errors import RaipackError
from raipack.validate import validate

pytestmark = [pytest.mark.xdist_group("ray")]  # one cluster for the module, on one xdist worker

TESTS = Path(__file__).resolve().parents[1]
RAY = Path(sys.executable).with_name("ray")
NODE_ENV = "RAIPACK_TEST_RAY_NODE"  # which node a task ran on, as its raylet passes its environment on
FAST_DEATH = {"RAY_health_check_period_ms": "300", "RAY_health_check_failure_threshold": "3",
              "RAY_health_check_timeout_ms": "300", "RAY_health_check_initial_delay_ms": "0"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A head node (1 CPU) and worker nodes (1 CPU, resource `worker`), each `ray start --block` in its own
    process group so that killing the group kills that node and nothing else."""

    def __init__(self, base: Path):
        self.base, self.port = base, _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
        self.nodes: dict[str, subprocess.Popen] = {}
        self.starts: dict[str, int] = {}

    def env(self, name: str) -> dict:
        return {**os.environ, **self.auth, **FAST_DEATH, NODE_ENV: name, "RAY_USAGE_STATS_ENABLED": "0",
                "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS / "test_pipeline")])}  # the fake stages, this module

    def start(self, name: str, *args: str) -> None:
        log = open(self.base / f"{name}.log", "a")  # the node writes it while it lives
        self.starts[name] = self.starts.get(name, 0) + 1
        cmd = [str(RAY), "start", "--block", "--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats",
               f"--temp-dir={self.base / f'{name}-{self.starts[name]}'}", *args]
        self.nodes[name] = subprocess.Popen(cmd, env=self.env(name), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start_head(self) -> None:
        self.start("head", "--head", f"--port={self.port}", "--include-dashboard=false")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"the Ray head did not listen on {self.address}: {(self.base / 'head.log').read_text()[-2000:]}")

    def start_worker(self, name: str = "worker") -> None:
        self.start(name, f"--address={self.address}", '--resources={"worker": 1}')

    def wait_nodes(self, n: int) -> None:
        """Wait until n nodes are alive. A node whose `ray start --block` ended (its raylet died while it
        started: a CI run once saw the worker's raylet abort in its NodeManager) is started again, once."""
        import ray

        deadline, restarted = time.monotonic() + 60, set()
        while sum(1 for node in ray.nodes() if node["Alive"]) < n:
            for name, proc in list(self.nodes.items()):
                if proc.poll() is not None:
                    log = (self.base / f"{name}.log").read_text(errors="replace")[-2000:]
                    assert name not in restarted and name != "head", f"the Ray node {name!r} ended twice:\n{log}"
                    print(f"the Ray node {name!r} ended (exit {proc.returncode}); starting it again:\n{log}")
                    restarted.add(name)
                    self.nodes.pop(name)
                    self.start_worker(name)
            assert time.monotonic() < deadline, f"the cluster has not {n} live nodes"
            time.sleep(0.1)

    def kill(self, name: str) -> None:
        """SIGKILL the node: its process group and the Ray workers it started (raylet puts them in sessions
        of their own), found by the node name and this cluster's token in their environment."""
        proc = self.nodes.pop(name)
        pids = [proc.pid, *self.processes(name)]
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL) if pid == proc.pid else os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait(30)

    def processes(self, name: str) -> list[int]:
        marks = (f"{NODE_ENV}={name}".encode(), f"RAY_AUTH_TOKEN={self.auth['RAY_AUTH_TOKEN']}".encode())
        out = []
        for environ in Path("/proc").glob("[0-9]*/environ"):
            try:
                items = environ.read_bytes().split(b"\0")
            except OSError:
                continue
            if all(m in items for m in marks) and int(environ.parent.name) != os.getpid():
                out.append(int(environ.parent.name))
        return out

    def stop(self) -> None:
        for name in list(self.nodes):
            self.kill(name)


@pytest.fixture(scope="module")
def cluster():
    base = Path(tempfile.mkdtemp(prefix="raipack-ray-"))
    c = Cluster(base)
    saved = {k: os.environ.get(k) for k in c.auth}
    os.environ.update(c.auth)  # the driver (RayExecutor's ray.init) needs the cluster's token
    try:
        c.start_head()
        c.start_worker()
        yield c
    finally:
        disconnect()  # first: a driver whose raylet dies exits its process, and that would be this xdist worker
        c.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(base, ignore_errors=True)


def disconnect() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


def connected(cluster: Cluster, nodes: int, cache_root=None):
    from raipack.batch.ray_executor import RayExecutor

    ex = RayExecutor(cluster.address, cache_root=cache_root)
    try:
        cluster.wait_nodes(nodes)
    except BaseException:
        ex.shutdown()  # a driver left connected would go down with the cluster, and this process with it
        raise
    return ex


# --------------------------------------------------------------------------- validate a zoo on the cluster

def test_validate_zoo_on_the_cluster(cluster, tmp_path, monkeypatch, capsys):
    from raipack.cli import main

    zoo = tmp_path / "zoo"
    for i in range(4):
        make_package(zoo, "1.8.0-npu-16K", name=f"m{i}")
    (zoo / "m3" / "tokenizer.json").write_text("{")  # one broken package
    planted = tmp_path / "cwd"  # a module named like raipack's, in the folder the command runs from
    (planted / "pipeline").mkdir(parents=True)
    (planted / "pipeline" / "__init__.py").write_text(f"open({str(tmp_path / 'RAN')!r}, 'w').write('planted')\n")
    monkeypatch.chdir(planted)
    with pytest.raises(SystemExit) as info:
        main(["validate", "--executor", "ray", "--address", cluster.address, "--format", "json", str(zoo)])
    out = capsys.readouterr().out
    results = json.loads(out)["results"]
    assert info.value.code == 1 and [Path(r["root"]).name for r in results] == ["m0", "m1", "m2", "m3"]
    assert [r["counts"]["error"] > 0 for r in results] == [False, False, False, True]
    assert not (tmp_path / "RAN").exists(), "a Ray worker imported the module planted in the current folder"


# --------------------------------------------------------------------------- the executor's own rules

def refuse(arg: dict) -> dict:
    raise RaipackError(f"stage {arg['stage']} refused its input", "give it another")


def test_executor_errors_and_resources(cluster):
    """A job's own error comes back as itself (its hint too), not wrapped in Ray's; a job that asks for a
    resource no node has is refused in one sentence naming it, instead of waiting forever."""
    from raipack.batch.ray_executor import task_options

    assert task_options({"memory": 3 * 2**30, "num_cpus": 2, "num_gpus": 0, "ryzenai_sdk": 1, "npu": 0}, 3) == {
        "num_cpus": 2, "memory": 3 * 2**30, "resources": {"ryzenai_sdk": 1}, "max_retries": 3, "retry_exceptions": False}
    assert task_options({"num_gpus": 1, "npu": 1}, 2)["num_gpus"] == 1
    ex = connected(cluster, 1)
    try:
        failing = ex.submit(refuse, {"stage": "fuse"}, {"num_cpus": 1})
        npu = ex.submit(refuse, {"stage": "smoke"}, {"num_cpus": 1, "npu": 1})
        huge = ex.submit(refuse, {"stage": "quantize"}, {"num_cpus": 1, "memory": 2**50})
        assert ex.wait([npu, huge], 0)[0] == [npu, huge]  # done at once
        with pytest.raises(RaipackError) as err:
            ex.result(failing)
        assert str(err.value) == "stage fuse refused its input" and err.value.hint == "give it another"
        with pytest.raises(RaipackError, match=r"no node of the Ray cluster has what the job asks for \(CPU 1, npu 1\)"):
            ex.result(npu)
        with pytest.raises(RaipackError, match=r"memory 1048576\.0 GiB"):
            ex.result(huge)
    finally:
        ex.shutdown()


# --------------------------------------------------------------------------- a batch, and a node killed

def fakes() -> dict:
    """The fake stages as the batch sees them, in the driver and in every Ray worker: quantize and export
    read no profile key (as the real ones), fuse writes the reference package of the entry's target."""
    from raipack.npu.profile import reference_for

    def target(job):
        return reference_for(job.profile).id

    out = {**fake_stages.FAKES, **{n: dataclasses.replace(fake_stages.FAKES[n], profile_keys=()) for n in ("quantize", "export")}}
    out["fuse"] = dataclasses.replace(out["fuse"], output_profile=target, run=lambda job: fake_stages._writer(target(job))(job))
    return out


def fake_stage_job(arg: dict) -> dict:
    """What the Ray task runs: the fake stages, then the real run_stage_job. It records which node ran
    which stage job, and the quantize jobs take long enough to be killed mid-write."""
    fake_stages.install()
    stage_mod.get = fakes().__getitem__
    os.environ[fake_stages.PACKAGES_ENV] = arg["packages"]
    from raipack.batch.jobs import run_stage_job

    job = arg["job"]
    with open(arg["signal"], "a") as fh:
        fh.write(f"{job['stage']} {job['key']} {os.environ.get(NODE_ENV, '?')} {os.getpid()}\n")
    return run_stage_job(job)


class Recording:
    """RayExecutor with every job run through fake_stage_job."""

    def __init__(self, inner, signal: Path, packages: Path):
        self.inner, self.signal, self.packages = inner, signal, packages

    def submit(self, fn, arg, resources):
        return self.inner.submit(fake_stage_job, {"job": arg, "signal": str(self.signal), "packages": str(self.packages)}, resources)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def started(signal_file: Path) -> list[list[str]]:
    text = signal_file.read_text() if signal_file.exists() else ""
    return [line.split() for line in text.splitlines(keepends=True) if line.endswith("\n")]


def write_matrix(root: Path) -> Path:
    for name in ("a", "b", "c"):  # three model folders, each its own digest; the fake stages never read them
        (root / "models" / name).mkdir(parents=True)
        (root / "models" / name / "config.json").write_text(json.dumps({"name": name}))
    text = ('output = "zoo"\nprofiles = ["1.8.0-npu-16K", "1.8.0-npu-4K"]\n[recipe.quantize]\nseconds = 2.0\n'
            + "".join(f'[[models]]\nname = "{m}"\npath = "models/{m}"\n' for m in "abc"))
    (root / "matrix.toml").write_text(text)
    return root / "matrix.toml"


def test_batch_on_the_cluster_survives_a_dead_node(cluster, tmp_path, monkeypatch, reference_dir):
    """3 models x 2 profiles: 3 quantize jobs, not 6. The worker node is SIGKILLed while a quantize job runs
    on it; Ray retries that task on the head, every package is built and valid, and the cache holds only
    complete entries (each with its manifest; a staging folder left by the dead node never looks complete)."""
    from raipack.batch.run import run_batch

    monkeypatch.setattr("raipack.builder.stages.get", fakes().__getitem__)
    monkeypatch.setattr("raipack.batch.matrix.check_model_dir", lambda path, trust: path.resolve())
    monkeypatch.setattr("raipack.report.page.write_build_page", lambda *a, **kw: None)  # raipack build's, tested there
    packages = reference_package("reference-16K").parent
    reference_package("reference-4K")
    monkeypatch.setenv(fake_stages.PACKAGES_ENV, str(packages))
    monkeypatch.chdir(tmp_path)
    if "worker" not in cluster.nodes:
        cluster.start_worker()
    cache_root, signal_file, killed = tmp_path / "cache", tmp_path / "started.txt", []

    def killer():  # kill the worker node once a quantize job has run on it for a moment
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            if any(s == "quantize" and node == "worker" for s, _key, node, _pid in started(signal_file)):
                time.sleep(0.5)
                cluster.kill("worker")
                killed.append(time.monotonic())
            time.sleep(0.05)

    def make(kind, jobs, address, root, warn, memory_free):
        return Recording(connected(cluster, 2, root), signal_file, packages)

    watcher = threading.Thread(target=killer, daemon=True)
    watcher.start()
    doc = run_batch(write_matrix(tmp_path), executor="ray", address=cluster.address, cache_root=cache_root,
                    line=lambda _: None, warn=lambda _: None, make=make)
    watcher.join(5)
    runs = started(signal_file)
    assert killed, f"no quantize job ran on the worker node: {runs}"
    quantize = [(key, node) for stage, key, node, _pid in runs if stage == "quantize"]
    assert len({key for key, _ in quantize}) == 3 and doc["jobs"]["quantize"] == 3  # not 6
    retried = [key for key, node in quantize if node == "worker"]
    assert any((key, "head") in quantize for key in retried), f"the killed job was not run again on the head: {runs}"
    assert [e["status"] for e in doc["entries"]] == ["built"] * 6, doc["entries"]
    for e in doc["entries"]:
        assert not validate(Path(e["package"])).failed(), e["package"]
    for stage_dir in (cache_root / "stages").iterdir():
        for item in stage_dir.iterdir():
            if item.name.startswith("."):
                assert not (item / manifest.NAME).exists(), f"{item} looks like a finished entry"
            else:
                assert manifest.is_complete(item), f"{item} is a half entry"


def test_real_stages_run_as_ray_tasks(cluster, tiny_llama, tmp_path, monkeypatch):
    """The real stages, not fakes, as Ray tasks on the cluster: the tiny model (RTN) for an NPU and a hybrid
    target shares one quantize and one export job; both packages come back valid, with the cache that every
    node sees (RAIPACK_CACHE) holding one complete entry per job."""
    from raipack.batch.run import exit_code, run_batch

    if "worker" not in cluster.nodes:
        cluster.start_worker()
    monkeypatch.chdir(tmp_path)
    cache_root = tmp_path / "cache"
    matrix = tmp_path / "m.toml"
    matrix.write_text(f'output = "zoo"\nprofiles = ["1.8.0-npu-4K", "1.8.0-hybrid"]\n[[models]]\nname = "tiny"\npath = "{tiny_llama}"\n'
                      '[recipe.quantize]\nalgorithm = "rtn"\nquality = false\n[recipe.smoke]\nmax_tier = 256\n')
    lines: list[str] = []
    doc = run_batch(matrix, executor="ray", address=cluster.address, cache_root=cache_root, line=lines.append, warn=lines.append,
                    make=lambda kind, jobs, address, root, warn, memory_free: connected(cluster, 2, root))  # the RayExecutor, once both nodes are up
    assert exit_code(doc) == 0, [e["error"] for e in doc["entries"]]
    assert doc["jobs"] == {"quantize": 1, "export": 1, "fuse": 2, "smoke": 2}, doc["jobs"]
    for e in doc["entries"]:
        assert e["status"] == "built" and not validate(Path(e["package"])).failed(), e
        assert manifest.read(Path(e["package"]))["target_profile"] == e["profile"]
    for stage in ("quantize", "export", "fuse"):
        entries = [p for p in (cache_root / "stages" / stage).iterdir() if not p.name.startswith(".")]
        assert entries and all(manifest.is_complete(p) for p in entries), stage
