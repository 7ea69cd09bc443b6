"""Put a finished folder in place of an older one without a moment where the name is empty.

On Linux the two folders trade names in one ``renameat2(RENAME_EXCHANGE)`` call, so the
final name always holds a complete folder, the old one or the new one. Elsewhere (or on a
filesystem without exchange) the old folder is renamed aside first; a run killed in
between leaves it aside, and :func:`recover` puts it back on the next run.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
from pathlib import Path

from raipack.core import manifest

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_ASIDE = ".old-"


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically; False when the platform cannot."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def replace_dir(new: Path, final: Path, *, exchange: bool = True) -> None:
    """Move the finished folder `new` to `final`, replacing (and removing) what was there."""
    new, final = Path(new), Path(final)
    if final.exists() and exchange and _exchange(new, final):
        manifest.mark_incomplete(new)  # `new` now holds the old folder: never looks finished again
        shutil.rmtree(new, ignore_errors=True)
        return
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}{_ASIDE}{os.getpid()}")
        os.rename(final, old)
    try:
        os.rename(new, final)
    except BaseException:
        if old is not None:
            os.rename(old, final)
        raise
    if old is not None:
        manifest.mark_incomplete(old)
        shutil.rmtree(old, ignore_errors=True)


def recover(final: Path, alive) -> None:
    """After a killed run: put an old folder left aside back, drop the rest."""
    final = Path(final)
    for item in sorted(final.parent.glob(f".{final.name}{_ASIDE}*")):
        pid = item.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or alive(int(pid)):
            continue
        if not final.exists() and manifest.is_complete(item):
            os.rename(item, final)
        else:
            shutil.rmtree(item, ignore_errors=True)
