"""One model's builds as one ONNX Runtime model package (docs/model_package.md).

Each package raipack built for the model (NPU 4K, NPU 16K, hybrid, ...) becomes a variant named by
its target profile; the unfused export they were fused from (found through each package's manifest
lineage in the build cache) becomes the CPU variant. Tokenizer files that are the same in several
variants are stored once, in `shared_assets/sha256-<hex>/`, and each variant's genai_config.json
names them with `model.tokenizer_dir = "sha256:<hex>"`, the one path onnxruntime-genai resolves
through the package. The package is written into a staging folder, validated variant by variant,
and only then renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from raipack import __version__
from raipack.benchmark import find_export
from raipack.builder.logs import LOG_NAME
from raipack.builder.swap import replace_dir
from raipack.core import lfs, manifest
from raipack.core.errors import RaipackError
from raipack.core.hashing import sha256_file
from raipack.core.output import atomic_write_text, copy_tree, output_folder
from raipack.core.package import role_of
from raipack.modelpackage import check, layout
from raipack.validate import validate


def assemble_model_package(packages: list[Path], out: Path, *, export: Path | None = None, cache_root: Path | None = None, name: str | None = None) -> Path:
    """Write the model package `out` from raipack packages of one model; return `out`."""

    out = Path(out)
    sources = [(_variant_name(Path(p)), Path(p)) for p in packages]
    names = [n for n, _ in sources]
    if len(set(names)) != len(names):
        raise RaipackError(f"two packages of {out.name} target the same profile ({', '.join(sorted({n for n in names if names.count(n) > 1}))})",
                           "give one package per target profile")
    sources += _exports(sources, export, cache_root)
    staging = out.parent / f".staging-{out.name}-{os.getpid()}"
    with output_folder(staging):
        variants = {vname: _add_variant(staging, vname, src) for vname, src in sources}
        doc = {"schema_version": layout.spec()["schema_version"], "package_name": name or out.name.removesuffix(layout.spec()["package_suffix"]),
               "components": {layout.spec()["component"]: {"variants": variants}},
               "additional_metadata": {"producer": {"tool": "raipack", "tool_version": __version__},
                                       "raipack": {"sources": {vname: str(src) for vname, src in sources}}}}
        lfs.write(staging)  # one repository on the Hub: the LFS rules of every variant's files, at the root
        atomic_write_text(staging / layout.spec()["manifest"], json.dumps(doc, indent=2) + "\n")
        result = check.validate_package(staging, validate=validate)
        errors = [f for f in result.findings if f.severity == "error"]
        if errors:
            raise RaipackError(f"the model package {out.name} fails validation: {errors[0].path}: {errors[0].message}", errors[0].hint)
    replace_dir(staging, out)  # the name always holds a finished package or none
    return out


def _variant_name(package: Path) -> str:
    doc = manifest.read(package)
    target = (doc or {}).get("target_profile")
    if not isinstance(target, str) or not target:
        raise RaipackError(f"{package / manifest.NAME} is missing, incomplete or names no target_profile; expected a package raipack built",
                           "build it with raipack build or raipack batch")
    return target


def _exports(sources: list[tuple[str, Path]], export: Path | None, cache_root: Path | None) -> list[tuple[str, Path]]:
    """The CPU variant(s): `export`, else each package's export found through its lineage."""

    found: list[Path] = [Path(export)] if export is not None else []
    for _, package in sources if export is None else ():
        path, why = find_export(package, cache_root)
        if path is None:
            raise RaipackError(f"the export of {package} is not found: {why}", "build it again so the cache holds its export, or pass the export folder")
        if path.resolve() not in [p.resolve() for p in found]:
            found.append(path)
    cpu = layout.spec()["cpu_variant"]
    return [(cpu if len(found) == 1 else f"{cpu}-{i + 1}", path) for i, path in enumerate(found)]


def _add_variant(staging: Path, vname: str, src: Path) -> dict:
    """Copy one package into the variant folder `vname`, its tokenizer files into a shared asset; return
    its manifest entry (ep, device, compatibility_string)."""
    vdir = staging / vname
    copy_tree(src, vdir, ignore=(manifest.NAME, LOG_NAME))  # a cache entry's records stay with the cache
    shared = [p for p in sorted(vdir.iterdir()) if p.is_file() and role_of(p.name) in layout.spec()["shared_roles"]]
    doc = json.loads((vdir / "genai_config.json").read_text("utf-8"))
    flat_text = layout.genai_text(doc)  # the variant as a flat folder: what its raipack manifest records
    source_doc = manifest.read(src) or {}
    entries = [e for e in source_doc.get("files", []) if e.get("path") not in ("genai_config.json", lfs.NAME) and ((vdir / e["path"]).is_file())]
    atomic_write_text(vdir / "genai_config.json", flat_text)
    entries.append({"path": "genai_config.json", "size": len(flat_text.encode()), "sha256": sha256_file(vdir / "genai_config.json"), "role": role_of("genai_config.json")})
    lfs.write(vdir)  # each variant checks as a package of its own, with its own LFS rules (an export has none)
    entries.append({"path": lfs.NAME, "size": (vdir / lfs.NAME).stat().st_size, "sha256": sha256_file(vdir / lfs.NAME), "role": role_of(lfs.NAME)})
    if shared:
        hex_ = _store_asset(staging, vname, shared)
        doc.setdefault("model", {})["tokenizer_dir"] = layout.spec()["reference_scheme"] + hex_
        atomic_write_text(vdir / "genai_config.json", layout.genai_text(doc))
    if source_doc:
        manifest.put(vdir, {**source_doc, "files": sorted(entries, key=lambda e: Path(e["path"]).parts)})
    return _declaration(vname, doc)


def _store_asset(staging: Path, vname: str, files: list[Path]) -> str:
    """Move `files` into the content-addressed folder of their digest (kept once); return the digest."""
    area = staging / layout.spec()["shared_assets"]
    tmp = area / f".tmp-{vname}"
    tmp.mkdir(parents=True)
    for path in files:
        os.rename(path, tmp / path.name)
    hex_ = layout.directory_digest(tmp)
    final = staging / layout.asset_folder(hex_)
    if final.exists():
        shutil.rmtree(tmp)
    else:
        os.rename(tmp, final)
    return hex_


def _declaration(vname: str, genai: dict) -> dict:
    """The variant's manifest entry: the execution provider its genai_config.json asks for, its device."""
    spec = layout.spec()
    options = ((genai.get("model") or {}).get("decoder") or {}).get("session_options") or {}
    providers = [name for block in options.get("provider_options") or [] if isinstance(block, dict) for name in block]
    ep = spec["ep_of_provider"].get(providers[0], f"{providers[0]}ExecutionProvider") if providers else "CPUExecutionProvider"
    entry = {"ep": ep, "device": spec["device_of_ep"].get(ep, "cpu")}
    if ep != "CPUExecutionProvider":
        entry["compatibility_string"] = vname  # the target profile: the EP scores it; raipack names the release and layout
    return entry


def assemble_model_packages(results_by_model: dict[str, list[dict]], out_dir: Path, cache_root: Path | None = None) -> dict[str, dict]:
    """raipack batch's `[model_package] assemble = true`: one model package per model from its entries'
    packages (batch results: {"status", "package", ...}); model -> {"status": "built"|"skipped"|"failed",
    "package": path|None, "error": str|None}. A model that fails does not stop the others."""
    out: dict[str, dict] = {}
    for model, results in results_by_model.items():
        packages = [Path(r["package"]) for r in results if r.get("status") in ("built", "cached") and r.get("package")]
        if not packages:
            out[model] = {"status": "skipped", "package": None, "error": "no package of this model was built"}
            continue
        name = Path(str(model)).name or "model"
        try:
            path = assemble_model_package(packages, Path(out_dir) / f"{name}{layout.spec()['package_suffix']}", cache_root=cache_root, name=name)
            out[model] = {"status": "built", "package": str(path), "error": None}
        except RaipackError as exc:
            out[model] = {"status": "failed", "package": None, "error": str(exc)}
    return out
