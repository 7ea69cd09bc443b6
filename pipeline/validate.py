"""Validate one package folder: scan, pick the profile, run the checks."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from raipack import places
from raipack.checks import Context, run_checks
from raipack.core.errors import NothingToValidate, RaipackError, UsageError
from raipack.core.findings import Result
from raipack.core.package import Package, role_of
from raipack.core.selection import Selection
from raipack.data import load_data
from raipack.modelpackage import check as model_package
from raipack.npu import detect as detection
from raipack.npu import kinds
from raipack.npu import profile as profiles
from raipack.places import guard, hfcache

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
    pkg = places.scan(path)
    for rel, doc in (virtual or {}).items():
        pkg.add_virtual_json(rel, doc)
    return open_scanned(pkg, profile, verify_hashes, jobs)


def open_scanned(pkg: Package, profile: str = "auto", verify_hashes: bool = False, jobs: int | None = None) -> tuple[Context, str]:
    """A scanned package (of any place: pipeline/places/) with its profile picked."""
    if not pkg.by_role(*MODEL_ROLES):
        raise NothingToValidate(
            f"{places.where(pkg)} holds no model package (no genai_config.json, config.json, .onnx or weights files)",
            "point raipack at the folder that holds genai_config.json",
        )
    if profile == "auto" and (other := kinds.not_genai(pkg)) is not None:
        raise NothingToValidate(f"{places.where(pkg)} {other[0]}", other[1])
    if profile == "auto":
        found = detection.detect(pkg)
        if found is None:
            prof, reason = profiles.get("oga-export"), "no profile matched; checked as a generic ONNX Runtime GenAI folder"
        else:
            prof, reason = found.profile, found.reason
    else:
        prof, reason = profiles.get(profile), "chosen with --profile"
    model_type = _model_type(pkg)
    if model_type in prof.model_overrides:
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


def validate(path: Path, profile: str = "auto", *, jobs: int | None = None, virtual: dict | None = None, **selection) -> Result:
    """Validate a folder; `selection` is Selection's fields (select, ignore, verify_hashes, platform: "linux"
    also holds it to AMD's Linux deployment steps, RP407); `virtual` maps file names to JSON documents that
    count as present (the runner checks a staged folder with its future manifest)."""
    chosen = Selection(**selection)
    if places.is_hub(path):
        return _validate_hub(str(path), profile, chosen, jobs)
    if profile == model_package.PROFILE or (profile == "auto" and model_package.is_model_package(path)):  # each variant with its own profile
        return model_package.validate_package(Path(path), chosen, jobs, validate=validate)
    start = time.perf_counter()
    ctx, reason = open_package(path, profile, chosen.verify_hashes, jobs, virtual)
    ctx.platform = chosen.platform
    findings, ran = run_checks(ctx, chosen.select, chosen.ignore)
    return Result(root=places.where(ctx.pkg), profile=ctx.profile.id, profile_reason=reason, findings=findings, checks_run=ran, files=len(ctx.pkg.files), seconds=time.perf_counter() - start)


def _validate_hub(target: str, profile: str, chosen: Selection, jobs: int | None) -> Result:
    """A Hub repository from its file list and small files; the checks that open any other file are
    reported as skipped (pipeline/places/hub.py, guard.py)."""
    from raipack.places import hub  # late: the hub extra: the light install has no huggingface_hub

    start = time.perf_counter()
    with hub.fetched(target, chosen.revision) as remote:
        ctx, reason = open_scanned(hub.open_remote(remote), profile, chosen.verify_hashes, jobs)
        ctx.platform = chosen.platform
        with guard.watch(remote.placeholders, lambda: ctx.current.id if ctx.current else "") as reads:
            findings, ran = run_checks(ctx, chosen.select, chosen.ignore)
        findings, ran = guard.skipped(findings, ran, reads, remote.why)
    return Result(root=remote.where, profile=ctx.profile.id, profile_reason=reason, findings=findings, checks_run=ran, files=len(ctx.pkg.files),
                  seconds=time.perf_counter() - start)


def expand(paths, revision: str | None = None) -> list:
    """Each PATH as given, except a zoo, which becomes its packages in name order.

    A zoo is a folder with no model file and no manifest.json of its own whose
    subfolders (not hidden, not symbolic links) hold packages; subfolders that
    hold no model file are left out."""
    out: list = []
    for given in paths:
        if places.is_hub(given):
            out.append(given)
            continue
        path = Path(given)
        out += hfcache.snapshots(path, revision) or _zoo_members(path) or [path]
    return out


def _zoo_members(path: Path) -> list[Path]:
    if not path.is_dir() or path.is_symlink() or _has_model_file(path) or (path / "manifest.json").exists():
        return []
    try:
        with os.scandir(path) as it:
            children = [Path(e.path) for e in it if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    return sorted(child for child in children if _has_model_file(child) or model_package.is_model_package(child))


def _has_model_file(folder: Path) -> bool:
    try:
        with os.scandir(folder) as it:
            return any(role_of(e.name) in MODEL_ROLES for e in it if e.is_file(follow_symlinks=False) or e.is_symlink())
    except OSError:
        return False


def validate_one(arg: dict) -> Result | RaipackError:
    """One folder of a many-package run, in whatever process runs it: its Result,
    or the user error that stopped it (returned, so one bad folder stops no other)."""
    try:
        path = arg["path"] if places.is_hub(arg["path"]) else Path(arg["path"])
        return validate(path, arg["profile"], jobs=arg["threads"], select=tuple(arg["select"]), ignore=tuple(arg["ignore"]),
                        verify_hashes=arg["verify_hashes"], platform=arg.get("platform"), revision=arg.get("revision"))
    except RaipackError as exc:
        return exc


def destinations() -> dict:
    """Where a package may be headed (`validate --for`), and the checks that are errors there."""
    return load_data("hub.json")["destinations"]


def for_destination(outcomes: list, destination: str | None) -> list:
    """The outcomes with the findings of the checks `destination` refuses made errors."""
    if not destination:
        return outcomes
    errors = set(destinations()[destination]["errors"])
    out = []
    for outcome in outcomes:
        if isinstance(outcome, Result):
            findings = [replace(f, severity="error") if f.check_id in errors else f for f in outcome.findings]
            outcome = replace(outcome, findings=findings)
        out.append(outcome)
    return out


def validate_all(paths, profile: str = "auto", *, jobs: int = 1, executor=None, **selection) -> list[Result | RaipackError]:
    """Validate every package of PATHS (zoos expanded): in this process, in a pool of
    `jobs` worker processes, or as tasks of `executor` (submit/wait/result, e.g. a
    RayExecutor); one outcome per folder, in order. `selection`: Selection's fields."""
    chosen = Selection(**selection)
    select, ignore, verify_hashes, platform = chosen.select, chosen.ignore, chosen.verify_hashes, chosen.platform
    folders = expand(paths, chosen.revision)
    many = len(folders) > 1
    threads = max(1, (os.cpu_count() or 1) // jobs) if many else jobs if jobs > 1 else None
    args = [{"path": str(p), "profile": profile, "select": list(select), "ignore": list(ignore), "verify_hashes": verify_hashes,
             "threads": 1 if executor is not None else threads, "platform": platform, "revision": chosen.revision} for p in folders]
    if executor is not None:
        handles = [executor.submit(validate_one, arg, {"num_cpus": 1}) for arg in args]
        pending = handles
        while pending:
            _done, pending = executor.wait(pending, None)
        return [executor.result(h) for h in handles]
    if jobs > 1 and many:
        from concurrent.futures import ProcessPoolExecutor

        first = validate_one(args[0])  # here first: the forked workers inherit the loaded checks and schemas
        with ProcessPoolExecutor(min(jobs, len(args) - 1)) as pool:  # a few chunks per worker: less pickling
            return [first, *pool.map(validate_one, args[1:], chunksize=max(1, len(args) // (4 * jobs)))]
    return [validate_one(arg) for arg in args]
