"""What an eval TARGET is: a package, an OGA export, a Quark folder or a source model folder."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from raipack.core.errors import UsageError
from raipack.core.package import Package
from raipack.data import load_data
from raipack.npu.detect import detect
from raipack.npu.target import Target as ProfileTarget

KINDS = ("source", "quark", "export", "package")


@dataclass
class Target:
    path: Path
    kind: str  # one of KINDS


def _config(folder: Path) -> dict:
    try:
        doc = json.loads((folder / "config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _is_package(folder: Path) -> bool:
    """A raipack or AMD package: a profile of a package target (not an intermediate one) fits it."""

    found = detect(Package.scan(folder))
    return found is not None and found.profile.target is not ProfileTarget.INTERMEDIATE


def detect_target(path: Path) -> Target:
    """The kind of `path`; UsageError (one sentence) when it is none of them."""
    folder = Path(path)
    if not folder.is_dir():
        raise UsageError(f"{folder} is not a folder", "give a package, an OGA export, a Quark export or a Hugging Face model folder")
    has_genai = (folder / "genai_config.json").is_file()
    if has_genai and _is_package(folder):
        return Target(folder, "package")
    if has_genai and (folder / "model.onnx").is_file():
        return Target(folder, "export")
    cfg = _config(folder)
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method") == "quark":
        return Target(folder, "quark")
    if cfg.get("model_type") and any(folder.glob("*.safetensors")):
        return Target(folder, "source")
    raise UsageError(f"{folder} is none of the folders raipack eval runs: no package, no genai_config.json with model.onnx, no config.json with safetensors weights",
                     "give a package, an OGA export, a Quark export (config.json quant_method quark) or a Hugging Face model folder")


def device_numerics(folder: Path) -> tuple[str, str]:
    """(the numerics the device of a package's profile target computes with, "") — bfp16 for NPU and hybrid
    packages and raipack's reference packages of them (pipeline/data/numerics.json "by_target"), float for
    the others — or ("float", why not) when they need amd-quark and it is not installed."""

    found = detect(Package.scan(Path(folder)))
    mode = load_data("numerics.json")["by_target"].get(found.profile.target.value if found else "", "float")
    if mode != "float" and importlib.util.find_spec("quark") is None:
        return "float", f"scored in float only: the device's {mode} numerics need amd-quark (raipack's build extra)"
    return mode, ""
