"""The quantize stage's output folder after Quark's export: the source files Quark does not copy,
config.json kept readable by the tools that read packages, the names of the quantized tensors
and the versions that made them."""

from __future__ import annotations

import fnmatch
import json
import shutil
from pathlib import Path
from typing import Any

from raipack.core.errors import RaipackError
from raipack.stages.quantize.preflight import HINT, PICKLE_SUFFIXES

# Files of the source that describe its *unquantized* weights: never copied over the export.
WEIGHT_FILE_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "*.bin.index.json")
NEVER_COPY = ("config.json", "manifest.json", "log.txt")  # log.txt: a build stage's library log (raipack.builder.logs)


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("amd-quark", "torch", "transformers"):
        try:
            out[dist.replace("amd-", "")] = version(dist)
        except PackageNotFoundError:
            out[dist.replace("amd-", "")] = "missing"
    return out


def copy_missing_files(src_dir: Path, out_dir: Path) -> list[str]:
    """Copy every source file Quark's export did not write, except the source weights."""
    copied = []
    for entry in sorted(src_dir.iterdir()):
        name = entry.name
        if name.startswith(".") or name in NEVER_COPY or (out_dir / name).exists():
            continue
        if entry.is_file() and (
            any(fnmatch.fnmatch(name, p) for p in WEIGHT_FILE_PATTERNS) or entry.suffix in PICKLE_SUFFIXES
        ):
            continue
        if entry.is_dir():
            shutil.copytree(entry, out_dir / name, symlinks=False)
        elif entry.is_file():
            shutil.copy2(entry, out_dir / name)
        else:
            continue
        copied.append(name)
    return copied


# transformers 5 saves rotary settings as `rope_parameters`; published checkpoints (and the tools that read
# packages: AMD's model_generate, older transformers) use these keys, so the source's own values are kept.
SOURCE_KEYS_KEPT = ("rope_scaling", "rope_theta", "original_max_position_embeddings")


def fix_config(out_dir: Path, src_cfg: dict | None = None) -> dict[str, Any]:
    path = out_dir / "config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    for key in SOURCE_KEYS_KEPT:
        if key in (src_cfg or {}) and key not in cfg:
            cfg[key] = src_cfg[key]
    qc = cfg.get("quantization_config")
    if not isinstance(qc, dict) or qc.get("quant_method") != "quark":
        raise RaipackError(f"{path}: Quark's export wrote no quark quantization_config", HINT)
    if not qc.get("kv_cache_quant_config"):
        qc["kv_cache_quant_config"] = {}
    cfg.pop("_name_or_path", None)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return qc


def quantized_tensor_names(out_dir: Path) -> list[str]:
    from safetensors import safe_open

    names = []
    for f in sorted(out_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            names += [k[: -len(".weight_scale")] for k in st.keys() if k.endswith(".weight_scale")]
    return sorted(names)
