"""Leftovers of killed builds: staging folders whose build is gone.

Every folder a build writes before it is finished carries the build's process id in its name:
`.staging-<key>-<pid>` in the cache (a stage writes only inside it), a discarded entry's
`.discarded-<key>-<pid>`, and `.<package>.staging-<pid>` beside the package. Folders that stages
of earlier raipack versions made beside their staging folder (`..staging-<key>-<pid>.tmp-*`,
`.cache-*`, ...) carry the same pid and are swept alike.

A build holds an exclusive `flock` on `<cache>/locks/<pid>` for its whole life. The kernel drops
the lock when the process ends, however it ends, so "is that build still running" has an exact
answer even after its pid is reused. A pid without a lock file (a build that could not write
one) falls back to whether any process has that pid.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from pathlib import Path

from raipack.builder.cache import remove

try:
    import fcntl
except ImportError:  # Windows: the pid check only
    fcntl = None

LOCKS = "locks"
CACHE_ITEM = re.compile(r"\.{1,2}(?:staging|discarded)-[0-9a-f]+-(\d+)(?:\..*)?", re.S)
_held: dict[str, int] = {}


def hold(root: Path) -> None:
    """Mark this process as a live build of the cache at `root` until `release` or its end."""
    path = Path(root) / LOCKS / str(os.getpid())
    if fcntl is None or str(path) in _held:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits only while a sweep removes a dead namesake's lock
            if _same_file(path, fd):
                break
            os.close(fd)  # that sweep unlinked the file we locked: lock a fresh one
    except OSError:  # a read-only cache: sweeps fall back to the pid check
        return
    _held[str(path)] = fd


def release(root: Path) -> None:
    """This process no longer builds into `root` (its lock file goes too)."""
    path = Path(root) / LOCKS / str(os.getpid())
    fd = _held.pop(str(path), None)
    if fd is not None:
        if _same_file(path, fd):
            os.unlink(path)
        os.close(fd)


def alive(pid: int, root: Path) -> bool:
    """Whether the build with this pid may still be writing (an earlier build of this process is not)."""
    with _gone(pid, root, tidy=False) as gone:
        return not gone


def sweep_cache(root: Path) -> list[Path]:
    """Remove every staging folder in the cache whose build is gone, and their lock files."""
    root = Path(root)
    owners: dict[int, list[Path]] = {}
    stages = root / "stages"
    for stage_dir in _children(stages):
        for item in _children(stage_dir):
            m = CACHE_ITEM.fullmatch(item.name)
            if m:
                owners.setdefault(int(m[1]), []).append(item)
    for lock in _children(root / LOCKS):
        if lock.name.isdigit():
            owners.setdefault(int(lock.name), [])
    return _sweep(owners, root)


def sweep_beside(folder: Path, prefix: str, root: Path) -> list[Path]:
    """Remove `<prefix><pid>` items of `folder` whose build is gone (the package's staging folders)."""
    owners: dict[int, list[Path]] = {}
    for item in _children(folder):
        pid = item.name[len(prefix):]
        if item.name.startswith(prefix) and pid.isdigit():
            owners.setdefault(int(pid), []).append(item)
    return _sweep(owners, root, tidy=False)


def _sweep(owners: dict[int, list[Path]], root: Path, tidy: bool = True) -> list[Path]:
    removed = []
    for pid, items in sorted(owners.items()):
        with _gone(pid, root, tidy) as gone:
            if gone:
                for item in items:
                    remove(item)
                    removed.append(item)
    return removed


@contextmanager
def _gone(pid: int, root: Path, tidy: bool):
    """Yield whether build `pid` is gone. While it yields True it holds that build's lock, so a new
    process that got the same pid waits before it writes; with `tidy` the lock file goes too."""
    if pid == os.getpid():  # one process runs one build at a time: what it left earlier is stale
        yield True
        return
    if fcntl is None:
        yield not _pid_exists(pid)
        return
    lock = Path(root) / LOCKS / str(pid)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        yield not _pid_exists(pid)
        return
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: that build is running
            yield False
            return
        yield True
        if tidy and _same_file(lock, fd):
            os.unlink(lock)
    finally:
        os.close(fd)


def _same_file(path: Path, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _pid_exists(pid: int) -> bool:
    if os.name == "nt":  # os.kill would end the process there: never sweep
        return True
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


def _children(folder: Path) -> list[Path]:
    try:
        return sorted(Path(folder).iterdir())
    except OSError:
        return []
