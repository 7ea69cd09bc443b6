"""lm-eval's loading of a task folder tried in a child process: no network, a memory and a time limit.

raipack has read every file of the folder as data (taskfolder.py) and written the folder lm-eval reads; still,
lm-eval and `datasets` parse what it holds. The child indexes the written folder and builds the named local
tasks (their data loaded) with sockets refused, `RLIMIT_AS` at `load_memory_mb` and a wall clock of
`load_seconds` (pipeline/data/eval_tasks.json); whatever goes wrong there (an exception, a crash, the
limits) is one sentence in the parent, and a hole in a library it calls stays in the child.

`python -m raipack.evaluation.loadcheck FOLDER NAME...` prints one JSON line: {"ok": true} or {"error": ...}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from raipack.core.env import OFFLINE
from raipack.core.errors import UsageError
from raipack.data import load_data
from raipack.evaluation.taskfolder import HINT


def _limits() -> None:  # runs in the child, before exec
    import resource

    mb = load_data("eval_tasks.json")["load_memory_mb"]
    resource.setrlimit(resource.RLIMIT_AS, (mb << 20, mb << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def check(folder: Path, names: list[str], log: Path) -> None:
    """The tasks `names` of the written `folder` load in a bounded child; else one UsageError sentence."""

    secs = load_data("eval_tasks.json")["load_seconds"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LD_"))}
    env.update(OFFLINE, HF_DATASETS_CACHE=str(folder.parent / "datasets"), HF_DATASETS_DISABLE_PROGRESS_BARS="1", NO_PROXY="*")
    cmd = [sys.executable, "-I", "-m", "raipack.evaluation.loadcheck", str(folder), *names]
    with open(log, "a", encoding="utf-8", errors="replace") as sink:
        try:
            done = subprocess.run(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=sink, stdin=subprocess.DEVNULL,
                                  timeout=secs, preexec_fn=_limits, check=False)
        except subprocess.TimeoutExpired:
            raise UsageError(f"lm-eval did not finish loading tasks {', '.join(names)} of the task folder within {secs} s",
                             "make the task folder's data smaller") from None
    lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1])
    except (IndexError, ValueError):
        answer = {"error": f"the loading process ended with code {done.returncode} (a crash, or over {load_data('eval_tasks.json')['load_memory_mb']} MB)"}
    if answer.get("template"):
        raise UsageError(f"a template of tasks {', '.join(names)} is not allowed: {answer['template']}", HINT)
    if not answer.get("ok"):
        raise UsageError(f"lm-eval cannot load tasks {', '.join(names)} of the task folder: {answer.get('error')}", HINT)


def _no_network() -> None:
    import socket

    def refuse(*_a, **_k):
        raise OSError("raipack's task loading has no network")

    socket.socket.connect = refuse  # type: ignore[method-assign]
    socket.create_connection = refuse  # type: ignore[assignment]
    socket.getaddrinfo = refuse  # type: ignore[assignment]


def main(argv: list[str]) -> int:
    _no_network()
    folder, names = Path(argv[0]), argv[1:]
    from jinja2.exceptions import SecurityError

    try:
        from lm_eval.tasks import TaskManager, get_task_dict

        # late: loads jinja2, only in the child that renders the chat template
        from raipack.evaluation.templates import sandboxed_templates

        with sandboxed_templates():
            tm = TaskManager(include_path=str(folder), include_defaults=False)
            local = [n for n in names if n in set(tm.all_tasks)]
            if local:
                get_task_dict(local, tm)
    except SecurityError as exc:  # a template reaching for Python objects, or past its budget
        print(json.dumps({"template": str(exc)[:400]}), flush=True)
        return 1
    except Exception as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(json.dumps({"error": f"{type(exc).__name__}: {text}"[:400]}), flush=True)
        return 1
    print(json.dumps({"ok": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
