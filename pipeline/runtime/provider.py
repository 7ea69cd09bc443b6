"""Where the RyzenAI provider library comes from, what a package may make onnxruntime-genai load, and
how a loaded model shows it runs on the NPU: the rules smoke, bench, eval and doctor share
(pipeline/runtime/readiness.py puts them together).

Nothing from the package, the model folder or the current folder is loaded:
- the provider library comes only from where the user put it: `$RYZENAI_EP_PATH` (an absolute path to
  the library or its folder), else the Ryzen AI install in `$RYZEN_AI_INSTALLATION_PATH`. Without one,
  nothing is tried (onnxruntime-genai would otherwise load `./libonnxruntime_providers_ryzenai.so` from
  the current folder). A library inside the package, the model folder or the export, or in the current
  folder itself, is refused.
- a genai_config.json that names a custom operator library or another provider is refused
  (onnxruntime-genai would load what it names).
- a model that loads is on the NPU only if `og.Model.device_type` names it and no log line says it fell
  back to the CPU; the device names and log phrases are data: pipeline/data/npu_evidence.json.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from raipack.core.package import JsonError, Package
from raipack.data import load_data
from raipack.npu.genai import provider_names
from raipack.npu.settings import INSTALL_ENV

LIBRARIES = {"win32": "onnxruntime_providers_ryzenai.dll"}  # the provider library's name where it is not a Linux .so
LIBRARY = LIBRARIES.get(sys.platform, "libonnxruntime_providers_ryzenai.so")
EP_ENV = "RYZENAI_EP_PATH"
INSTALL_DIRS = ("", "lib", "lib64", "deployment", "deployment/lib")  # where an install keeps the library


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


def _evidence() -> tuple[list[str], list[str]]:
    """(device names that mean the NPU, log phrases that mean a CPU fallback), lower case."""

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
