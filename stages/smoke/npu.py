"""Try the package on the NPU through onnxruntime-genai and its RyzenAI provider.

Never reports a CPU run as an NPU run: the attempt either loads the model
with the package's own RyzenAI provider block and generates, or returns the
exact error onnxruntime-genai gave, in one line.

Whether it is tried at all is pipeline/runtime/readiness.py's answer (the one bench, eval and doctor
get): a provider library where the user put it (never from the package, the model folder, the export or
the current folder), a package that names no library, onnxruntime-genai, the NPU, the library loading and
onnxruntime-genai knowing RyzenAI. Then:
- the attempt runs in a child process whose working folder is a fresh empty
  temporary folder, with `RYZENAI_EP_PATH` set to the library found; a crash
  or hang of the provider ends that process, not the build.

A model that loads and generates is not yet an NPU run: onnxruntime-genai may
have run it on the CPU (the silent fallback users report). What this relies on,
from onnxruntime-genai 0.18's Python API (the session's provider list is not
exposed by it):
- `og.Model.device_type`, the device the model runs on ("CPU" for a CPU run,
  measured): it must name the NPU ("RyzenAI"), else the attempt is a fallback;
  a runtime without that property cannot confirm an NPU run, so none is claimed.
- onnxruntime-genai's log (`og.set_log_options(enabled=True, warning=True)`,
  `og.set_log_callback`) and the child's stderr (ONNX Runtime's own logger):
  a line that says the provider found no device or fell back to the CPU
  ("No RyzenAI devices detected", "falling back to CPU", ...) makes it a fallback.
The device names and log phrases are data: pipeline/data/npu_evidence.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from raipack.runtime.provider import EP_ENV, device_problem, fallback_line
from raipack.runtime.readiness import npu_readiness
from raipack.runtime.trust import first_line

TIMEOUT_S = 1800  # loading and compiling a large model on the NPU takes minutes
RESULT = "raipack-npu-result "  # prefix of the child's one result line on stdout


@dataclass
class NpuAttempt:
    ok: bool
    reason: str  # one line: why it did not run (the real error), or what ran
    tokens: list[list[int]] = field(default_factory=list)
    seconds: float = 0.0


def try_npu(pkg_dir, prompts: list[list[int]], max_new_tokens: int, untrusted=()) -> NpuAttempt:
    """Generate `max_new_tokens` greedy tokens after each prompt on the NPU, or say exactly why not.

    `untrusted`: folders besides the package a provider library must not come from."""
    start = time.perf_counter()
    pkg = Path(pkg_dir).resolve()
    readiness = npu_readiness(pkg, untrusted)
    if not readiness.ready:
        return NpuAttempt(False, readiness.reason)
    library = readiness.library
    root = str(Path(__file__).resolve().parents[2])  # where this raipack's `stages` package lives
    env = {**os.environ, **readiness.child_env(), "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "raipack.stages.smoke.npu", str(pkg), str(int(max_new_tokens))]
    with tempfile.TemporaryDirectory(prefix="raipack-npu-") as empty:
        try:
            proc = subprocess.run(command, input=json.dumps(prompts), capture_output=True, text=True, errors="replace",
                                  cwd=empty, env=env, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return NpuAttempt(False, f"the NPU attempt did not finish within {TIMEOUT_S} s ({EP_ENV}={library})", seconds=time.perf_counter() - start)
    results = [line[len(RESULT):] for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if not results:
        last = (proc.stderr.strip().splitlines() or [""])[-1][:300]
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
        return NpuAttempt(False, f"the NPU attempt ended without a result ({how}): {last} ({EP_ENV}={library})", seconds=time.perf_counter() - start)
    attempt = NpuAttempt(**json.loads(results[-1]))
    logged = fallback_line(proc.stderr.splitlines())
    if attempt.ok and logged:
        attempt = NpuAttempt(False, f"the model loaded but ran on the CPU: the runtime logged {logged!r}")
    if not attempt.ok:
        attempt.reason += f" ({EP_ENV}={library})"
    attempt.seconds = time.perf_counter() - start
    return attempt


@contextmanager
def oga_log(og, lines: list[str]):
    """Collect onnxruntime-genai's log lines (warnings included) into `lines` while inside."""
    hooked = hasattr(og, "set_log_callback") and hasattr(og, "set_log_options")
    if hooked:
        try:
            og.set_log_options(enabled=True, warning=True)
            og.set_log_callback(lambda text: lines.append(str(text)))
        except Exception:  # a runtime without these options: stderr is still read by the parent
            hooked = False
    try:
        yield
    finally:
        if hooked:
            og.set_log_callback(None)  # OGA 0.18 aborts the interpreter at exit if a Python callback is left set


def generate(og, pkg_dir, prompts: list[list[int]], max_new_tokens: int) -> NpuAttempt:
    """The attempt itself, with onnxruntime-genai module `og` (run in the child process)."""
    logged: list[str] = []
    with oga_log(og, logged):
        try:
            model = og.Model(str(pkg_dir))  # uses the package's provider_options: [{"RyzenAI": {...}}]
        except Exception as exc:  # OGA raises RuntimeError/OSError with the provider's own text
            return NpuAttempt(False, first_line(exc))
        problem = device_problem(model)
        if problem:
            return NpuAttempt(False, problem)
        try:
            out = [_greedy(og, model, ids, max_new_tokens) for ids in prompts]
        except Exception as exc:
            return NpuAttempt(False, f"the model loaded but generation failed: {first_line(exc)}")
    line = fallback_line(logged)
    if line:
        return NpuAttempt(False, f"the model loaded but ran on the CPU: onnxruntime-genai logged {line!r}")
    return NpuAttempt(True, f"onnxruntime-genai with the RyzenAI provider (og.Model.device_type {str(model.device_type)!r}, no fallback logged)", out)


def _greedy(og, model, ids: list[int], max_new_tokens: int) -> list[int]:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + max_new_tokens, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    new = []
    while not gen.is_done() and len(new) < max_new_tokens:
        gen.generate_next_token()
        new.append(int(gen.get_next_tokens()[0]))
    return new


def _child(argv: list[str]) -> None:
    try:
        import onnxruntime_genai as og
    except ImportError as exc:
        attempt = NpuAttempt(False, f"onnxruntime-genai cannot be imported ({first_line(exc)})")
    else:
        attempt = generate(og, argv[0], json.loads(sys.stdin.read()), int(argv[1]))
    print(RESULT + json.dumps(asdict(attempt)), flush=True)


if __name__ == "__main__":
    _child(sys.argv[1:])
