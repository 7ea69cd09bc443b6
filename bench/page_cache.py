"""The page cache before a measured stage (issue 41): a user's first build reads a source that is not in
memory, so `bench/real_size.py` measures each stage cold by default, the page cache dropped first.

Linux drops its clean page cache when root writes 1 to /proc/sys/vm/drop_caches (after `sync` has written
the dirty pages back; 1 is the page cache alone, not dentries and inodes). A user who cannot write it gets
a warm measurement, said so in the row and on the terminal, never a row that claims to be cold.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop(control: Path = DROP_CACHES) -> str | None:
    """Write dirty pages back and drop the clean page cache. None when dropped, else why not (a sentence)."""
    os.sync()
    try:
        with open(control, "w") as fh:
            fh.write("1\n")
    except OSError as exc:
        return (f"{control} cannot be written ({exc.strerror or exc}): only root can drop the page cache, "
                "so this stage was measured warm; run the bench as root for cold rows")
    return None


def resident_bytes(files: list[Path]) -> int | None:
    """How much of `files` is in the page cache now (util-linux's fincore), None when fincore is not there."""
    paths = [str(p) for p in files if p.is_file()]
    if not paths:
        return 0
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *paths], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return sum(int(line) for line in out.split())


def prepare(cold: bool, watched: list[Path], control: Path = DROP_CACHES) -> dict:
    """The page cache's state for the next stage: dropped when `cold` (and root), and what of `watched` (the
    model's weights, the earlier stages' outputs) is resident as the stage starts."""
    if not cold:
        return {"cache": "warm", "cache_note": "asked for warm (--warm)", "resident_bytes": resident_bytes(watched)}
    why_not = drop(control)
    return {"cache": "cold" if why_not is None else "warm", "cache_note": why_not or "page cache dropped before the stage",
            "resident_bytes": resident_bytes(watched)}
