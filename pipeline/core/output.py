"""Writing files atomically, the folder a stage writes into, and whether to colour the terminal."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from raipack.core.errors import RaipackError


def use_color(stream) -> bool:
    """Colour on a terminal. NO_COLOR set and not empty turns it off (no-color.org); FORCE_COLOR set and
    not empty turns it on where the stream is not a terminal (force-color.org); with both set, NO_COLOR wins."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return hasattr(stream, "isatty") and stream.isatty()


@contextmanager
def output_folder(folder: Path) -> Iterator[Path]:
    """The folder a stage function writes into, and nothing else: created when missing, refused when
    not empty (nothing of a user's is ever replaced or deleted). If the body fails, what it wrote is
    removed again, and the folder too when this call created it. Staging, validating and swapping a
    finished output into place is the build runner's alone (pipeline/builder/runner.py, swap.py)."""
    folder = Path(folder)
    created = not folder.exists() and not folder.is_symlink()
    if not created and (folder.is_symlink() or not folder.is_dir() or any(folder.iterdir())):
        raise RaipackError(f"{folder} is not an empty folder; a stage writes only into a new or empty one",
                           "choose a new output folder, or remove this one first")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RaipackError(f"cannot create {folder}: {exc.strerror or exc}", "choose a folder you can write to") from None
    try:
        yield folder
    except BaseException:
        if created:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            for item in folder.iterdir():
                shutil.rmtree(item, ignore_errors=True) if item.is_dir() and not item.is_symlink() else item.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes, like: os.stat_result | None = None) -> None:
    """Write to a temporary file beside `path`, fsync, then rename over it.

    `like`: the stat of the file being replaced; the new file gets its mode and,
    where permitted, its owner. Without it the file gets the mode a plain `open(path, "w")`
    gives, 0666 less the umask (mkstemp's temporary file is private, 0600: a manifest.json or
    report.json left so could not be read by another account's validate)."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    except OSError as exc:
        raise RaipackError(f"cannot write {path}: {exc.strerror or exc}", "choose a folder you can write to") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            if like is not None:
                _take_mode(fh.fileno(), like)
            else:
                os.fchmod(fh.fileno(), 0o666 & ~umask())
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


def umask() -> int:
    """The process's umask, read from /proc (Linux) so no other thread ever sees it changed; elsewhere
    set and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _take_mode(fd: int, like: os.stat_result) -> None:
    for uid, gid in ((like.st_uid, like.st_gid), (-1, like.st_gid)):
        try:
            os.fchown(fd, uid, gid)  # before fchmod: a chown clears set-id bits
            break
        except OSError:
            continue  # not permitted: keep our own owner (and group, when that fails too)
    os.fchmod(fd, stat.S_IMODE(like.st_mode))


def copy_tree(src: Path, dst: Path, ignore: tuple[str, ...] = ()) -> None:
    """Copy a folder's files (but the names `ignore` matches) into `dst`, each in storage of its own and
    writable like a new file: a user editing a package copied out of the build cache never touches the cache."""
    shutil.copytree(src, dst, copy_function=_copy_file, ignore=shutil.ignore_patterns(*ignore), dirs_exist_ok=True)
    mode = 0o777 & ~umask()
    for dirpath, _, _ in os.walk(dst):  # copytree gave the folders the source's (a sealed entry's read-only) mode
        os.chmod(dirpath, mode)


def _copy_file(src: str, dst: str) -> None:  # shutil.copytree passes str
    """A reflink where the filesystem offers one (btrfs, XFS: shared until either side is written),
    else a kernel copy (shutil uses sendfile)."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        try:
            import fcntl  # late: POSIX only; elsewhere the plain copy below

            fcntl.ioctl(fout.fileno(), _FICLONE, fin.fileno())
            return
        except (ImportError, OSError):
            pass
    shutil.copyfile(src, dst)


_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
