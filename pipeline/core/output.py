"""Writing files atomically, and whether to colour the terminal."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from pipeline.core.errors import RaipackError


def use_color(stream) -> bool:
    return "NO_COLOR" not in os.environ and hasattr(stream, "isatty") and stream.isatty()


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes, like: os.stat_result | None = None) -> None:
    """Write to a temporary file beside `path`, fsync, then rename over it.

    `like`: the stat of the file being replaced; the new file gets its mode and,
    where permitted, its owner (a temporary file is otherwise private, 0600)."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    except OSError as exc:
        raise RaipackError(f"cannot write {path}: {exc.strerror or exc}", "choose a folder you can write to") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            if like is not None:
                _take_mode(fh.fileno(), like)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise RaipackError(f"cannot write {path}: {exc.strerror or exc}", "check free space and permissions") from None


def _take_mode(fd: int, like: os.stat_result) -> None:
    for uid, gid in ((like.st_uid, like.st_gid), (-1, like.st_gid)):
        try:
            os.fchown(fd, uid, gid)  # before fchmod: a chown clears set-id bits
            break
        except OSError:
            continue  # not permitted: keep our own owner (and group, when that fails too)
    os.fchmod(fd, stat.S_IMODE(like.st_mode))
