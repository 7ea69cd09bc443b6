"""The content-addressed stage cache.

An entry is `<cache>/stages/<stage>/<key>/`, a finished stage output with its
manifest. The key hashes the stage's name and version, its config, the
digests of its inputs and the versions of the tools it calls, so an unchanged
rerun is a lookup. Staging folders (`.staging-*`) never count as entries.

A committed entry is sealed: files 0444, folders 0555, and the lstat of every
item (size, mtime, ctime, inode, mode) recorded in `<cache>/stamps/<stage>/<key>.json`.
A lookup compares the stamp (microseconds); when anything differs, or on
request, it hashes every file against the manifest's sha256. An entry whose
bytes changed is discarded and rebuilt; one whose bytes are intact (a copied
cache, a `touch`) is sealed again. The manifest itself is trusted only as the
key index recorded it at commit (`<cache>/index/<stage>/<key>.json`, its
sha256): an entry rewritten together with its own manifest is not a hit, with
or without --verify-cache (docs/security.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

from raipack.core import manifest
from raipack.core.errors import RaipackError
from raipack.core.hashing import sha256_many
from raipack.core.output import atomic_write_text

try:
    import fcntl
except ImportError:  # Windows: no commit lock (a second writer's rename then fails and it rebuilds next time)
    fcntl = None

ENV = "RAIPACK_CACHE"
STAMPS = "stamps"
LOCKS = "locks"
INDEX = "index"  # <cache>/index/<stage>/<key>.json: the manifest digest each entry was committed with


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


@contextmanager
def committing(path: Path):
    """Hold the commit lock of the entry `path` (`<cache>/locks/commit-<stage>-<key>`, an exclusive flock) while
    a writer checks whether another one committed the key first and, if not, commits its own folder: two
    workers building one key (two batch jobs, two machines sharing $RAIPACK_CACHE) end with one complete entry."""
    path = Path(path)
    lock = path.parent.parent.parent / LOCKS / f"commit-{path.parent.name}-{path.name}"
    fd = None
    if fcntl is not None:
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:  # a read-only cache: nothing is committed to it anyway
            fd = None
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # the lock file stays: unlinking it would let a third writer lock another inode


def lookup(stage: str, cache_key: str, root: Path | None = None, *, verify: bool = False, warn=None) -> Path | None:
    """The entry, if it is complete and its files are the bytes its manifest recorded.

    A changed entry is discarded; `warn` gets one line naming the file."""
    path = entry(stage, cache_key, root)
    doc = manifest.read(path)
    if doc is None or (path / manifest.INCOMPLETE).exists():
        return None  # a killed build's entry: rebuilt silently
    problem = unrecorded(path)  # the entry's own manifest is only trusted as the key index recorded it
    if problem is None and not verify and _read_stamp(path) == stamp(path):
        return path
    problem = problem or changed_file(path, doc)
    if problem is None:
        seal(path)  # moved, copied or touched, bytes intact
        return path
    try:
        discard(path)
    except OSError as exc:
        raise RaipackError(f"cache: the {stage} entry {path} was changed after it was cached ({problem}) and cannot be removed: {exc.strerror or exc}",
                           f"remove it (`raipack cache clear {stage}`), or set ${ENV} to a folder you own") from None
    if warn:
        warn(f"cache: the {stage} entry {cache_key} was changed after it was cached ({problem}): discarded, rebuilding {stage}")
    return None


def _index_path(path: Path) -> Path:
    """<cache>/index/<stage>/<key>.json for the entry <cache>/stages/<stage>/<key>."""
    return path.parent.parent.parent / INDEX / path.parent.name / f"{path.name}.json"


def _manifest_sha(path: Path) -> str | None:
    try:
        return hashlib.sha256((path / manifest.NAME).read_bytes()).hexdigest()
    except OSError:
        return None


def record(path: Path, doc: dict) -> None:
    """The key index's record of the entry `path` about to be committed with manifest `doc`: the sha256 of the
    manifest's bytes, outside the entry, written before the manifest (a build killed in between leaves a record
    and no complete entry: no hit). A writer that rewrites an entry with a manifest of its own cannot make it
    match without writing the index too."""
    target = _index_path(Path(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(manifest.text(doc).encode("utf-8")).hexdigest()
    atomic_write_text(target, json.dumps({"manifest_sha256": digest}))


def unrecorded(path: Path) -> str | None:
    """Why the entry's manifest is not the one the key index recorded at commit (None when it is)."""
    try:
        recorded = json.loads(_index_path(path).read_text()).get("manifest_sha256")
    except (OSError, ValueError, AttributeError):
        return "the key index has no record of it"
    if recorded is None or recorded != _manifest_sha(path):
        return f"{manifest.NAME} is not the one the key index recorded at commit"
    return None


def changed_file(path: Path, doc: dict) -> str | None:
    """The first file of the entry that differs from its manifest (added, missing, other bytes), or None."""
    try:
        listed = {f["path"]: f for f in doc["files"]}
    except (KeyError, TypeError):
        return "manifest.json has no file list"
    present = {p.relative_to(path).as_posix() for p in manifest.list_files(path)}
    for rel in sorted(present - set(listed)):
        return f"{rel} is not in its manifest"
    for rel in sorted(set(listed) - present):
        return f"{rel} is missing"

    digests = sha256_many([path / rel for rel in listed])
    for rel in sorted(listed):
        digest = digests[path / rel]
        if isinstance(digest, OSError):
            return f"{rel} cannot be read: {digest.strerror or digest}"
        if digest != listed[rel].get("sha256"):
            return f"{rel} no longer has the sha256 recorded when it was cached"
    return None


def seal(path: Path) -> None:
    """Make a committed entry read-only and record the stat of every item in it."""
    path = Path(path)
    try:
        for dirpath, _dirnames, filenames in os.walk(path, topdown=False):
            for name in filenames:
                p = os.path.join(dirpath, name)
                if not os.path.islink(p):
                    os.chmod(p, 0o444)
            os.chmod(dirpath, 0o555)
        _stamp_path(path).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(_stamp_path(path), json.dumps(stamp(path)))
    except (OSError, RaipackError):  # a read-only cache: the next lookup hashes instead
        pass


def stamp(path: Path) -> dict:
    """lstat of every item of an entry; ctime changes with any write and cannot be set back."""
    items = [str(path)]
    for dirpath, dirnames, filenames in os.walk(path):
        items += [os.path.join(dirpath, name) for name in (*dirnames, *filenames)]
    out = {}
    for p in items:
        st = os.lstat(p)
        out[os.path.relpath(p, path)] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, st.st_mode]
    return out


def _read_stamp(path: Path) -> dict | None:
    try:
        return json.loads(_stamp_path(path).read_text())
    except (OSError, ValueError):
        return None


def _stamp_path(path: Path) -> Path:
    """<cache>/stamps/<stage>/<key>.json for the entry <cache>/stages/<stage>/<key>."""
    return path.parent.parent.parent / STAMPS / path.parent.name / f"{path.name}.json"


def discard(path: Path) -> None:
    """Move an entry aside (no lookup finds it from here on), then remove it."""
    aside = path.with_name(f".discarded-{path.name}-{os.getpid()}")
    remove(aside)
    os.rename(path, aside)
    _stamp_path(path).unlink(missing_ok=True)
    _index_path(path).unlink(missing_ok=True)
    remove(aside)


def remove(path: Path) -> None:
    """Remove a folder (or file) even where it is sealed read-only."""
    path = Path(path)
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
        return
    for dirpath, _, _ in os.walk(path):  # top-down: each folder writable before its children go
        try:
            os.chmod(dirpath, 0o755)
        except OSError:
            pass
    shutil.rmtree(path, ignore_errors=True)


def folder_digest(folder: Path, memo: bool = True) -> str:
    """Digest of a folder: its manifest's bytes when it has a complete one, else
    of every file's path, size and sha256, memoised on path, size, mtime, inode
    and ctime (an edit that keeps size and mtime, `cp -p`, `rsync -t`, `tar`,
    still changes ctime); `memo=False` (--verify-cache) hashes every file again."""
    folder = Path(folder)
    if manifest.is_complete(folder):
        return hashlib.sha256((folder / manifest.NAME).read_bytes()).hexdigest()

    memo_path, use_memo = cache_root() / "digests.json", memo
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    if not isinstance(memo, dict):
        memo = {}
    paths = manifest.list_files(folder)
    todo, parts = [], {}
    for p in paths:
        st = p.stat()
        tag = f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}|{st.st_dev}|{st.st_ctime_ns}"
        if use_memo and isinstance(memo.get(tag), str):
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
    root = root or cache_root()
    outputs = root / "stages" / stage if stage else root / "stages"
    n = sum(1 for _ in outputs.rglob(manifest.NAME)) if outputs.is_dir() else 0
    remove(outputs)
    remove(root / STAMPS / stage if stage else root / STAMPS)
    remove(root / INDEX / stage if stage else root / INDEX)
    return n
