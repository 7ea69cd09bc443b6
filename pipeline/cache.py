"""The content-addressed stage cache.

An entry is `<cache>/stages/<stage>/<key>/`, a finished stage output with its
manifest. The key hashes the stage's name and version, its config, the
digests of its inputs and the versions of the tools it calls, so an unchanged
rerun is a lookup. Staging folders (`.staging-*`) never count as entries.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from . import manifest

ENV = "RAIPACK_CACHE"


def cache_root() -> Path:
    """$RAIPACK_CACHE, else the platform's user cache folder."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local")) / "raipack" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "raipack"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "raipack"


def key(stage: str, version: str, config: dict, inputs: dict[str, str], tools: dict[str, str]) -> str:
    doc = {"stage": stage, "version": version, "config": config, "inputs": inputs, "tools": tools}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:32]


def entry(stage: str, cache_key: str, root: Path | None = None) -> Path:
    return (root or cache_root()) / "stages" / stage / cache_key


def lookup(stage: str, cache_key: str, root: Path | None = None) -> Path | None:
    path = entry(stage, cache_key, root)
    return path if manifest.is_complete(path) else None


def folder_digest(folder: Path) -> str:
    """Digest of a folder: its manifest's bytes when it has a complete one, else
    of every file's path, size and sha256 (memoised by size and mtime)."""
    folder = Path(folder)
    if manifest.is_complete(folder):
        return hashlib.sha256((folder / manifest.NAME).read_bytes()).hexdigest()
    from .hashing import sha256_many

    memo_path = cache_root() / "digests.json"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    paths = manifest.list_files(folder)
    todo, parts = [], {}
    for p in paths:
        st = p.stat()
        tag = f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}"
        if tag in memo:
            parts[p] = memo[tag]
        else:
            todo.append((p, tag))
    for p, digest in sha256_many([p for p, _ in todo]).items():
        if isinstance(digest, OSError):
            raise digest
        parts[p] = digest
    for p, tag in todo:
        memo[tag] = parts[p]
    try:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        from .output import atomic_write_text

        atomic_write_text(memo_path, json.dumps(memo))
    except Exception:  # a read-only cache still builds; it only hashes again next time
        pass
    h = hashlib.sha256()
    for p in paths:
        h.update(f"{p.relative_to(folder).as_posix()}\0{parts[p]}\n".encode())
    return h.hexdigest()


def entries(root: Path | None = None) -> list[dict]:
    base = (root or cache_root()) / "stages"
    out = []
    if not base.is_dir():
        return out
    for stage_dir in sorted(base.iterdir()):
        for item in sorted(stage_dir.iterdir()):
            doc = manifest.read(item)
            size = sum(f.stat().st_size for f in item.rglob("*") if f.is_file())
            out.append({"stage": stage_dir.name, "key": item.name, "path": str(item), "bytes": size,
                        "complete": doc is not None and not item.name.startswith("."), "created": (doc or {}).get("created", "")})
    return out


def clear(stage: str | None = None, root: Path | None = None) -> int:
    base = (root or cache_root()) / "stages"
    targets = [base / stage] if stage else ([base] if base.exists() else [])
    n = 0
    for t in targets:
        if t.exists():
            n += sum(1 for _ in t.rglob("manifest.json"))
            shutil.rmtree(t)
    return n
