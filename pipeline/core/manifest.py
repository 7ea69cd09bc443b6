"""manifest.json: written last into every output folder; its presence means "finished"."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from raipack import __version__
from raipack.core.hashing import sha256_many
from raipack.core.jsonread import loads_strict
from raipack.core.output import atomic_write_text
from raipack.core.package import ReadError, read_regular, role_of

MAX_BYTES = 64 << 20  # a manifest lists files: a few KB to a few MB

NAME = "manifest.json"
INCOMPLETE = ".raipack-incomplete"  # present while raipack is still writing a folder


def tool_versions(dists: tuple[str, ...] = ()) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"raipack": __version__}
    for dist in dists:
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    return out


def list_files(folder: Path) -> list[Path]:
    return sorted(p for p in Path(folder).rglob("*") if p.is_file() and p.name not in (NAME, INCOMPLETE))


def write(folder: Path, kind: str, **kw) -> dict:
    """Hash every file of `folder` and write its manifest atomically, last."""
    doc = describe(folder, kind, **kw)
    put(folder, doc)
    return doc


def mark_incomplete(folder: Path) -> None:
    (Path(folder) / INCOMPLETE).write_text("raipack is writing this folder; it is not finished\n")


def text(doc: dict) -> str:
    """The bytes `put` writes, as text (the cache's key index records their digest before the write)."""
    return json.dumps(doc, indent=2) + "\n"


def put(folder: Path, doc: dict) -> None:
    atomic_write_text(Path(folder) / NAME, text(doc))


def describe(folder: Path, kind: str, *, stage: dict | None = None, lineage: dict | None = None, tools: dict | None = None, extra: dict | None = None) -> dict:
    """The manifest of `folder` (every file hashed), not yet written."""
    folder = Path(folder)
    paths = list_files(folder)
    digests = sha256_many(paths)
    files = []
    for p in paths:
        rel = p.relative_to(folder).as_posix()
        digest = digests[p]
        if isinstance(digest, OSError):
            raise digest
        files.append({"path": rel, "size": p.stat().st_size, "sha256": digest, "role": role_of(rel)})
    doc = {
        "format": "raipack-manifest",
        "format_version": 1,
        "generator": {"name": "raipack", "version": __version__},
        "kind": kind,
        "stage": stage,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "files": files,
        "lineage": lineage or {"inputs": [], "stages": []},
        "tools": tools or tool_versions(),
        **(extra or {}),
        "complete": True,
    }
    return doc


def read(folder: Path) -> dict | None:
    """The manifest of a finished folder, or None (missing, broken, incomplete)."""
    try:
        raw = read_regular(Path(folder) / NAME, MAX_BYTES)  # never blocks on a FIFO put in its place
        doc = loads_strict(raw.decode("utf-8")) if len(raw) <= MAX_BYTES else None
    except (OSError, ValueError, ReadError):  # JsonError is a ValueError: duplicate keys, non-finite numbers, deep nesting
        return None
    return doc if isinstance(doc, dict) and doc.get("complete") is True else None


def is_complete(folder: Path) -> bool:
    """A folder is finished when its manifest is complete and every listed file has its size."""
    doc = read(folder)
    if doc is None or (Path(folder) / INCOMPLETE).exists():
        return False
    for entry in doc.get("files", []):
        try:
            if os.stat(Path(folder) / entry["path"]).st_size != entry["size"]:
                return False
        except (OSError, KeyError, TypeError):
            return False
    return True
