"""Try the package on the NPU through onnxruntime-genai and its RyzenAI provider.

Never reports a CPU run as an NPU run: the attempt either loads the model
with the package's own RyzenAI provider block and generates, or returns the
exact error onnxruntime-genai gave, in one line.

Nothing from the package, the model folder or the current folder is loaded:
- the provider library comes only from where the user put it: `$RYZENAI_EP_PATH`
  (an absolute path to the library or its folder), else the Ryzen AI install in
  `$RYZEN_AI_INSTALLATION_PATH`. Without one, nothing is tried (onnxruntime-genai
  would otherwise load `./libonnxruntime_providers_ryzenai.so` from the current
  folder). A library inside the package, the model folder or the export, or in the
  current folder itself, is refused.
- a genai_config.json that names a custom operator library or another provider is
  refused (onnxruntime-genai would load what it names).
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

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from raipack.runtime.trust import first_line

LIBRARIES = {"win32": "onnxruntime_providers_ryzenai.dll"}  # the provider library's name where it is not a Linux .so
LIBRARY = LIBRARIES.get(sys.platform, "libonnxruntime_providers_ryzenai.so")
EP_ENV = "RYZENAI_EP_PATH"
INSTALL_ENV = "RYZEN_AI_INSTALLATION_PATH"
INSTALL_DIRS = ("", "lib", "lib64", "deployment", "deployment/lib")  # where an install keeps the library
TIMEOUT_S = 1800  # loading and compiling a large model on the NPU takes minutes
RESULT = "raipack-npu-result "  # prefix of the child's one result line on stdout


@dataclass
class NpuAttempt:
    ok: bool
    reason: str  # one line: why it did not run (the real error), or what ran
    tokens: list[list[int]] = field(default_factory=list)
    seconds: float = 0.0


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def find_provider_library(untrusted=()) -> tuple[Path | None, str]:
    """(the provider library to load, "") or (None, one line saying why none is used and where it looked).

    `untrusted` are folders a library must not come from (the package, the model folder, the export)."""
    ep, install = os.environ.get(EP_ENV, ""), os.environ.get(INSTALL_ENV, "")
    if ep:
        chosen = Path(ep)
        if not chosen.is_absolute():
            return None, f"{EP_ENV}={ep} is not an absolute path, so no RyzenAI provider library was loaded (a relative path would load from the current folder)"
        looked = [chosen / LIBRARY] if chosen.is_dir() else [chosen]
        source = f"{EP_ENV}={ep}"
    elif install:
        looked = [Path(install) / sub / LIBRARY for sub in INSTALL_DIRS]
        source = f"{INSTALL_ENV}={install}"
    else:
        return None, f"no RyzenAI provider library found: {EP_ENV} is not set and {INSTALL_ENV} is not set (the current folder is never searched)"
    found = next((p for p in looked if p.is_file()), None)
    if found is None:
        return None, f"no RyzenAI provider library found: {source} holds none (looked for {', '.join(map(str, looked))})"
    real = found.resolve()
    for folder in untrusted:
        if folder and _inside(real, Path(folder).resolve()):
            return None, f"the RyzenAI provider library {real} ({source}) is inside {Path(folder).resolve()}, which raipack reads as input; a library from a model or package is never loaded"
    try:
        cwd = Path.cwd().resolve()
    except OSError:  # the current folder was removed: nothing can be loaded from it
        cwd = None
    if real.parent == cwd:
        return None, f"the RyzenAI provider library {real} ({source}) is in the current folder; raipack loads no library from there (run from another folder, or keep the Ryzen AI install outside it)"
    return real, ""


def package_problem(pkg: Path) -> str:
    """Why the package cannot be handed to onnxruntime-genai without loading something it names ("" if it can)."""
    from raipack.core.package import JsonError, Package
    from raipack.npu.genai import provider_names

    files = Package.scan(pkg)
    bad = [f for f in files.scan_findings if f.severity == "error"]
    if bad:
        return f"{pkg / bad[0].path} {bad[0].message}"
    try:
        genai = files.json("genai_config.json")
    except JsonError as exc:
        return f"{pkg / 'genai_config.json'} {exc}"
    session = genai
    for key in ("model", "decoder", "session_options"):
        session = session.get(key) if isinstance(session, dict) else None
    if isinstance(session, dict) and "custom_ops_library" in session:
        return f"{pkg / 'genai_config.json'} names a custom operator library (model.decoder.session_options.custom_ops_library); raipack loads no library a package names"
    others = [name for name in provider_names(genai) if name != "RyzenAI"]
    if others:
        return f"{pkg / 'genai_config.json'} asks for execution provider {others[0]!r} besides RyzenAI; the NPU attempt runs the RyzenAI provider only"
    return ""


def try_npu(pkg_dir, prompts: list[list[int]], max_new_tokens: int, untrusted=()) -> NpuAttempt:
    """Generate `max_new_tokens` greedy tokens after each prompt on the NPU, or say exactly why not.

    `untrusted`: folders besides the package a provider library must not come from."""
    start = time.perf_counter()
    pkg = Path(pkg_dir).resolve()
    library, why = find_provider_library([pkg, *untrusted])
    if library is None:
        return NpuAttempt(False, why)
    if importlib.util.find_spec("onnxruntime_genai") is None:
        return NpuAttempt(False, "onnxruntime-genai is not installed")
    problem = package_problem(pkg)
    if problem:
        return NpuAttempt(False, problem)
    root = str(Path(__file__).resolve().parents[2])  # where this raipack's `stages` package lives
    env = {**os.environ, EP_ENV: str(library), "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
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


def _evidence() -> tuple[list[str], list[str]]:
    """(device names that mean the NPU, log phrases that mean a CPU fallback), lower case."""
    from raipack.data import load_data

    data = load_data("npu_evidence.json")
    return [v.lower() for v in data["npu_device_types"]["values"]], [v.lower() for v in data["fallback_log_patterns"]["values"]]


def fallback_line(lines) -> str:
    """The first log line that says the run fell back to the CPU ("" if none)."""
    patterns = _evidence()[1]
    return next((" ".join(str(line).split())[:300] for line in lines if any(p in str(line).lower() for p in patterns)), "")


def device_problem(model) -> str:
    """Why the loaded model is not running on the NPU, from og.Model.device_type ("" if it is)."""
    device = getattr(model, "device_type", None)
    if device is None:
        return "the model loaded but onnxruntime-genai does not say which device runs it (no og.Model.device_type), so an NPU run cannot be confirmed"
    if str(device).lower() in _evidence()[0]:
        return ""
    where = "the CPU" if str(device).lower() == "cpu" else f"the {device} device"
    return f"the model loaded but ran on {where}: og.Model.device_type is {str(device)!r}, not RyzenAI (the RyzenAI provider was not used)"


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
