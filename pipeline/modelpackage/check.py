"""Validate an ONNX Runtime model package: its manifest (MP001), its variant folders (MP002), the
`sha256:` references of each variant (MP003), the digest of each shared asset (MP004), then every
variant with its own profile, as the flat folder it resolves to (pipeline/modelpackage/resolve.py),
its findings named by variant and by the package file they are about."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from raipack.core import schemas
from raipack.core.errors import RaipackError
from raipack.core.findings import Finding, Result
from raipack.core.package import Package
from raipack.core.selection import Selection
from raipack.modelpackage import layout, resolve
from raipack.npu import profile as profiles
from raipack.npu.detect import condition_holds

# How one flat package folder is validated: raipack.validate.validate, handed in by the caller (the
# validate layer sits above this module, so importing it here would make a circle).
FolderValidator = Callable[..., Result]

PROFILE = "ort-model-package"


def is_model_package(path: Path) -> bool:
    """An ONNX Runtime model package as the profile ort-model-package detects it: manifest.json with
    components, and no genai_config.json beside it."""
    path = Path(path)
    if not path.is_dir() or not layout.looks_like_package(path):
        return False
    pkg = Package.scan(path)
    return all(condition_holds(pkg, c) for c in profiles.get(PROFILE).detect.content)


class _Findings:
    """The package-level checks (MP ids, pipeline/data/ort_model_package.json) that --select/--ignore leave on."""

    def __init__(self, select, ignore):
        select, ignore = tuple(select), tuple(ignore)
        self.items: list[Finding] = []
        self.ran = {c for c in layout.spec()["checks"]
                    if (not select or any(c.startswith(i) for i in select)) and not any(c.startswith(i) for i in ignore)}

    def on(self, check_id: str) -> bool:
        return check_id in self.ran

    def add(self, check_id: str, path: str, message: str, hint: str, pointer: str = "") -> None:
        if self.on(check_id):
            self.items.append(Finding(check_id, "error", path, message, hint, pointer))


def validate_package(path: Path, selection: Selection | None = None, jobs: int | None = None, *, validate: FolderValidator) -> Result:
    """Validate the model package at `path`, each variant's folder with `validate`; findings name the
    variant they are about."""
    start = time.perf_counter()
    root = Path(path)
    selection = selection or Selection()
    out = _Findings(selection.select, selection.ignore)
    name = layout.spec()["manifest"]
    try:
        doc = layout.read_manifest(root)
    except ValueError as exc:
        doc = None
        out.add("MP001", name, str(exc), "write manifest.json as raipack schemas ort_model_package describes")
    found = _manifest(doc, out) if doc is not None else []
    profiles_used, files = [], 1
    _assets(root, out)
    _entries(root, out)
    for variant in found:
        if not _variant_folder(root, variant, out):
            continue
        result = _variant(root, variant, out, selection, jobs, validate)
        if result is not None:
            profiles_used.append(f"{variant.name}: {result.profile}")
            files += result.files
    reason = (f"{name} declares an ONNX Runtime model package; each variant checked with its own profile ({'; '.join(profiles_used)})"
              if profiles_used else f"{name} declares an ONNX Runtime model package")
    return Result(root=str(root), profile=PROFILE, profile_reason=reason, findings=out.items, checks_run=sorted(out.ran),
                  files=files, seconds=time.perf_counter() - start)


def _manifest(doc, out: _Findings) -> list[layout.Variant]:
    """MP001: the manifest against its schema, with exactly one component (onnxruntime-genai loads one)."""
    name = layout.spec()["manifest"]
    errors = schemas.errors("ort_model_package", doc)
    for pointer, sentence in errors:
        out.add("MP001", name, sentence, "see raipack schemas ort_model_package", pointer)
    if errors:
        return []
    if len(doc["components"]) != 1:
        out.add("MP001", name, f"declares {len(doc['components'])} components ({', '.join(doc['components'])}); onnxruntime-genai loads a package of exactly one",
                f"put every variant under one component named {layout.spec()['component']!r}", "/components")
        return []
    return layout.variants(doc)


def _variant_folder(root: Path, variant: layout.Variant, out: _Findings) -> bool:
    """MP002: the variant's folder is a real folder inside the package with a genai_config.json."""
    folder = root / variant.directory
    problem = None
    if folder.is_symlink() or (folder.is_dir() and not layout.inside(root, folder)):
        problem = f"variant {variant.name}: its folder {variant.directory} leaves the package or is a link"
    elif not folder.is_dir():
        problem = f"variant {variant.name}: its folder {variant.directory} is missing"
    elif not (folder / "genai_config.json").is_file():
        problem = f"variant {variant.name}: {variant.directory}/genai_config.json is missing"
    if problem:
        out.add("MP002", variant.directory, problem, "every variant the manifest declares needs its own folder with a complete genai_config.json")
    return problem is None


def _entries(root: Path, out: _Findings) -> None:
    """MP002: the package root holds files and folders only (a link could lead out of it)."""
    for entry in sorted(root.iterdir()):
        if entry.is_symlink() or not (entry.is_file() or entry.is_dir()):
            out.add("MP002", entry.name, f"{entry.name} is a link or a special file", "a package holds regular files and folders only")


def _assets(root: Path, out: _Findings) -> None:
    """MP004: every shared asset folder is named sha256-<hex> and has that digest."""
    area = root / layout.spec()["shared_assets"]
    if not area.is_dir() or not out.on("MP004"):
        return
    prefix = layout.spec()["asset_prefix"]
    for entry in sorted(area.iterdir()):
        rel = entry.relative_to(root).as_posix()
        hex_ = entry.name.removeprefix(prefix)
        if not entry.name.startswith(prefix) or not layout.HEX.match(hex_) or entry.is_symlink() or not entry.is_dir():
            out.add("MP004", rel, f"{rel} is not a shared asset folder named {prefix}<64 hex digits>", "keep only content-addressed asset folders in shared_assets")
            continue
        try:
            actual = layout.directory_digest(entry)
        except OSError as exc:
            out.add("MP004", rel, f"{rel} cannot be hashed: {exc.strerror or exc}", "check its files")
            continue
        if actual != hex_:
            out.add("MP004", rel, f"{rel} has the digest {actual}, not the one its name says", "a file of the shared asset changed since it was written; write the package again")


def _references(root: Path, variant: layout.Variant, out: _Findings) -> None:
    """MP003: every sha256: reference of the variant's genai_config.json names an asset of the package."""
    rel = f"{variant.directory}/genai_config.json"
    try:
        doc = layout.load_json(root / rel)
    except ValueError:
        return  # the variant's own checks report it
    for pointer, value in layout.references(doc):
        hex_, tail = layout.split_reference(value)
        if layout.asset_path(root, value) is None:
            out.add("MP003", rel, f"variant {variant.name}: {value} names no shared asset of the package ({layout.asset_folder(hex_)}{'/' + tail if tail else ''} is missing)",
                    "store the referenced files in shared_assets/sha256-<their digest>, or write the package again", pointer)


def _variant(root: Path, variant: layout.Variant, out: _Findings, selection: Selection, jobs: int | None, validate: FolderValidator) -> Result | None:
    """The variant's own checks on the flat folder it resolves to; findings mapped back to package paths."""
    _references(root, variant, out)
    with tempfile.TemporaryDirectory(prefix="raipack-variant-") as tmp:
        try:
            origin = resolve.view(root, variant, Path(tmp) / variant.name)
        except (ValueError, OSError) as exc:
            out.add("MP002", variant.directory, f"variant {variant.name}: {exc}", "give every variant a folder of regular files inside the package")
            return None
        for rel, src in origin.items():
            if not src:
                out.add("MP002", f"{variant.directory}/{rel}", f"variant {variant.name}: {rel} is not a regular file", "a package holds regular files only")
        try:
            result = validate(Path(tmp) / variant.name, jobs=jobs, **selection.as_options())
        except RaipackError as exc:
            out.add("MP002", variant.directory, f"variant {variant.name}: {exc}", getattr(exc, "hint", "") or "give every variant a complete package")
            return None
    out.ran.update(result.checks_run)
    for f in result.findings:
        path = origin.get(f.path) or (f"{variant.directory}/{f.path}" if f.path else variant.directory)
        out.items.append(Finding(f.check_id, f.severity, path, f"{f.message} (variant {variant.name})", f.hint, f.pointer))
    return result
