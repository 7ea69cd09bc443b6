"""Where a stage's output goes once it is built: its report naming the final folder instead of the
staging one, the rename into the cache with its manifest written last (the manifest is the commit),
the seal, and the build folder's link to the entry. The build runner (pipeline/builder/runner.py)
stages, validates and calls these; pipeline/batch/graph.py links the entries of a batch's packages."""

from __future__ import annotations

import os
from pathlib import Path

from raipack.builder import cache
from raipack.core import manifest


def relocated(value, work: Path, final: Path):
    """`value` (a stage's report) with every mention of its staging folder naming the final one."""
    if isinstance(value, str):
        return value.replace(str(work), str(final))
    if isinstance(value, dict):
        return {k: relocated(v, work, final) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [relocated(v, work, final) for v in value]
    return value


def commit(work: Path, final: Path, doc: dict) -> None:
    """Rename the folder into place, then write its manifest: the manifest is the
    commit, so no folder ever holds a complete manifest before it is in place.
    Then seal it read-only."""
    cache.record(final, doc)  # the key index: the manifest digest a later hit must have, before the manifest exists
    os.rename(work, final)
    manifest.put(final, doc)
    (final / manifest.INCOMPLETE).unlink(missing_ok=True)
    cache.seal(final)


def link_stage_output(out_root: Path, pkg_name: str, name: str, path: Path) -> None:
    """build/<package>.stages/<stage> points at the stage's cache entry."""
    links = out_root / f"{pkg_name}.stages"
    links.mkdir(exist_ok=True)
    link = links / name
    tmp = links / f".{name}.{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(path, tmp)
    os.replace(tmp, link)
