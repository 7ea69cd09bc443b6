"""The `ryzenai-sdk` fuse backend: AMD's own `model_generate`, when it is installed.

The tool is Windows-only and closed. raipack calls it the way Olive's
RyzenGenerateModelLLM pass and lemonade do — `generate_model(mode=..., recipe=..., ...)`
from the `model_generate` Python module — or, where only the executable exists,
with the argument form in data/sdk_backend.json; then the runner checks its output
with the same checks as raipack's own packages. Which mode, recipe and extra options
a target uses is the `sdk` block of its release profile, overridable in the recipe.

Nothing from an input is imported: the module must not come from the current
folder, the build's input folders or the output, and it runs in a child process
whose working folder is a fresh empty temporary folder and whose import path
holds neither; a crash or hang of the tool ends that process, not the build.
The contract is tested with a fake module and a fake executable.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from raipack.core.errors import RaipackError, UsageError
from raipack.npu.spec import Profile
from raipack.runtime.trust import first_line

DATA = Path(__file__).with_name("data") / "sdk_backend.json"
INSTALL_HINT = "use --backend reference, or install the Ryzen AI SDK (its model-generate package, or model_generate on PATH)"


def settings() -> dict:
    return json.loads(DATA.read_text("utf-8"))


def find_tool() -> str | None:
    """The model_generate executable: $RAIPACK_MODEL_GENERATE, else on PATH."""
    cfg = settings()
    explicit = os.environ.get(cfg["env"])
    if explicit:
        return explicit if Path(explicit).is_file() else None
    return shutil.which(cfg["executable"])


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _cwd() -> Path | None:
    try:
        return Path.cwd().resolve()
    except OSError:  # the current folder was removed
        return None


def find_module(untrusted=()) -> tuple[str | None, str]:
    """(the file the `model_generate` module would be imported from, "") or (None, why not).

    A module found in the current folder or in one of the `untrusted` folders (the build's
    inputs, the output) is refused with a sentence; no module at all is (None, "")."""
    name = settings()["module"]
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        return None, f"the {name} module cannot be looked up ({first_line(exc)})"
    if spec is None or spec.origin is None:  # none, or a bare folder of that name (a namespace package holds no generate_model)
        return None, ""
    if not Path(spec.origin).is_file():
        return None, f"the {name} module found on the import path is not a file raipack can check ({spec.origin})"
    origin = Path(spec.origin).resolve()
    cwd = _cwd()
    for label, folder in [("the current folder", cwd), *(("an input of this build", Path(f).resolve()) for f in untrusted if f)]:
        if folder is not None and _inside(origin, folder):
            return None, f"the {name} module found at {origin} is inside {label} ({folder}); raipack imports no module from there"
    return str(origin), ""


def module_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(settings()["distribution"])
    except PackageNotFoundError:
        return "not installed"


def call_settings(profile: Profile, config=None) -> dict:
    """mode, recipe, mem_optimize and extra_options for `profile` (its `sdk` block), the recipe's [fuse] overrides applied."""
    block = profile.sdk
    if not block:
        raise UsageError(f"profile {profile.id} has no model_generate settings (its `sdk` block), so the ryzenai-sdk backend cannot build it",
                         "build a 1.7.1 or 1.8.0 target (see `raipack profiles`), or use --backend reference")
    extra = dict(block.extra_options)
    extra.update(getattr(config, "extra_options", None) or {})
    return {"mode": block.mode, "input": block.input, "recipe": getattr(config, "recipe", None) or block.recipe,
            "mem_optimize": bool(getattr(config, "mem_optimize", False) or block.mem_optimize), "extra_options": extra}


def argv(tool: str, call: dict, export_dir: Path, out_dir: Path) -> list[str]:
    form = settings()["argv"]
    cmd = [tool] + [a.format(out=str(out_dir), **{"in": str(export_dir)}) for a in form[call["mode"]]]
    if call["recipe"]:
        cmd.append(form["recipe"].format(recipe=call["recipe"]))
    if call["mem_optimize"]:
        cmd.append(form["mem_optimize"])
    if call["extra_options"]:
        cmd += [form["extra_options"], *(f"{k}={v}" for k, v in call["extra_options"].items())]
    return cmd


def generate(profile: Profile, export_dir: Path, out_dir: Path, config=None, untrusted=()) -> dict:
    """Run model_generate on `export_dir` (the OGA export, or the Quark folder where the profile's `sdk.input` says so) into `out_dir`; its report, `sdk` saying how it ran."""
    call = call_settings(profile, config)
    module, why = find_module([export_dir, out_dir, *untrusted])
    if why:
        raise RaipackError(why, "remove or rename that file, or run raipack from another folder; install model-generate into the Python environment")
    start = time.perf_counter()
    if module:
        sdk = {"via": "python", "module_path": module, **call, "version": module_version()}
        _run_python(module, call, export_dir, out_dir)
        log_tail = []
    else:
        tool = find_tool()
        if tool is None:
            raise RaipackError("AMD's model_generate is not installed (it ships with the Ryzen AI SDK, on Windows)", INSTALL_HINT)
        cmd = argv(tool, call, export_dir, out_dir)
        sdk = {"via": "executable", "command": cmd, **call, "version": module_version()}
        log_tail = _run_executable(cmd)
    return {"backend": "ryzenai-sdk", "sdk": sdk, "command": sdk.get("command"), "seconds": round(time.perf_counter() - start, 2), "log_tail": log_tail}


def _run_executable(cmd: list[str]) -> list[str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=settings()["timeout_s"])
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RaipackError(f"model_generate could not run: {exc}", "check the Ryzen AI SDK installation") from None
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        raise RaipackError(f"model_generate failed: {last[0][:300]}", "see model_generate's log; raipack checks its output only when it succeeds")
    return proc.stdout.strip().splitlines()[-5:]


def _run_python(module: str, call: dict, export_dir: Path, out_dir: Path) -> None:
    """generate_model(...) in a child process: its output goes to the stage's log, a raise or a crash becomes one sentence."""
    cfg = settings()
    kwargs = {"mode": call["mode"], "output_dir": str(out_dir), "input_model": str(export_dir), "recipe": call["recipe"],
              "mem_optimize": call["mem_optimize"], "model_name": None, "output_model_name": None,
              "extra_options": call["extra_options"], "verbose": cfg["verbose"]}
    root = str(Path(__file__).resolve().parents[2])  # where this raipack's `stages` package lives
    cwd = _cwd()
    path = [p for p in sys.path if p and (cwd is None or Path(p).resolve() != cwd)]
    hint = "see the fuse stage's log (model_generate's own output); raipack checks its output only when it succeeds"
    with tempfile.TemporaryDirectory(prefix="raipack-sdk-") as empty:
        result = Path(empty) / "result.json"
        job = {"module": module, "path": path, "kwargs": kwargs, "result": str(result)}
        env = {**os.environ, "PYTHONPATH": root}
        try:
            proc = subprocess.run([sys.executable, "-P", "-m", "raipack.stages.fuse.sdk"], input=json.dumps(job), text=True,
                                  cwd=empty, env=env, timeout=cfg["timeout_s"])
        except subprocess.TimeoutExpired:
            raise RaipackError(f"model_generate did not finish within {cfg['timeout_s']} s", hint) from None
        try:
            done = json.loads(result.read_text("utf-8"))
        except (OSError, ValueError):
            how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
            raise RaipackError(f"model_generate failed: it ended without a result ({how})", hint) from None
    if not done.get("ok"):
        raise RaipackError(f"model_generate failed: {done.get('error', '')}", hint)


def _child(job: dict) -> dict:
    """In the child: import model_generate from the file the parent checked, call generate_model."""
    sys.path[:] = job["path"]
    try:
        import model_generate
    except BaseException as exc:  # any failure of the tool is one sentence
        return {"ok": False, "error": f"cannot import it ({first_line(exc)})"}
    if str(Path(model_generate.__file__ or "").resolve()) != job["module"]:
        return {"ok": False, "error": f"it was imported from {model_generate.__file__}, not from {job['module']}"}
    try:
        getattr(model_generate, settings()["function"])(**job["kwargs"])
    except BaseException as exc:
        return {"ok": False, "error": first_line(exc)}
    return {"ok": True}


if __name__ == "__main__":
    _job = json.loads(sys.stdin.read())
    Path(_job["result"]).write_text(json.dumps(_child(_job)), "utf-8")
