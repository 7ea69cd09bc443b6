"""Validate one package folder: scan, pick the profile, run the checks."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pipeline.checks import Context, run_checks
from pipeline.core.errors import NothingToValidate, UsageError
from pipeline.core.findings import Result
from pipeline.core.package import Package
from pipeline.npu import profile as profiles

MODEL_ROLES = ("genai_config", "graph", "model_config", "safetensors", "npu_weights", "npu_header", "metastate")


def open_package(path: Path, profile: str = "auto", verify_hashes: bool = False, jobs: int | None = None, virtual: dict | None = None) -> tuple[Context, str]:
    """Scan a folder and pick its profile; raise a user error when it is no package."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path} does not exist", "give the path of a package folder")
    if path.is_file() and path.name == "genai_config.json":
        path = path.parent  # pre-commit passes the changed genai_config.json files
    if not path.is_dir():
        raise UsageError(f"{path} is a file; expected a package folder", f"validate its folder: raipack validate {path.parent}")
    if not os.access(path, os.R_OK | os.X_OK):
        raise UsageError(f"{path} cannot be read", "check the folder's permissions")
    pkg = Package.scan(path)
    for rel, doc in (virtual or {}).items():
        pkg.add_virtual_json(rel, doc)
    if not pkg.by_role(*MODEL_ROLES):
        raise NothingToValidate(
            f"{path} holds no model package (no genai_config.json, config.json, .onnx or weights files)",
            "point raipack at the folder that holds genai_config.json",
        )
    if profile == "auto":
        found = profiles.detect(pkg)
        if found is None:
            prof, reason = profiles.get("oga-export"), "no profile matched; checked as a generic ONNX Runtime GenAI folder"
        else:
            prof, reason = found.profile, found.reason
    else:
        prof, reason = profiles.get(profile), "chosen with --profile"
    model_type = _model_type(pkg)
    if model_type in (prof.get("model_overrides") or {}):
        prof, reason = profiles.for_model(prof, model_type), f"{reason}; with its {model_type} settings"
    return Context(pkg, prof, verify_hashes=verify_hashes, jobs=jobs), reason


def _model_type(pkg: Package) -> str | None:
    """The model family: config.json's model_type, else genai_config.json's model.type."""
    for rel, pointer in (("config.json", ("model_type",)), ("genai_config.json", ("model", "type"))):
        node = pkg.try_json(rel)
        for key in pointer:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, str):
            return node
    return None


def validate(path: Path, profile: str = "auto", select=(), ignore=(), verify_hashes: bool = False, jobs: int | None = None, virtual: dict | None = None) -> Result:
    """Validate a folder; `virtual` maps file names to JSON documents that count
    as present (the runner checks a staged folder with its future manifest)."""
    start = time.perf_counter()
    ctx, reason = open_package(path, profile, verify_hashes, jobs, virtual)
    findings, ran = run_checks(ctx, select, ignore)
    return Result(root=str(ctx.pkg.root), profile=ctx.profile["id"], profile_reason=reason, findings=findings, checks_run=ran, files=len(ctx.pkg.files), seconds=time.perf_counter() - start)
