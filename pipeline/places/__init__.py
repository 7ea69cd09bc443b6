"""Where a package's files come from: a plain folder, a Hugging Face cache snapshot, a Hub repository.

Every place hands the checks the same view, a `Package` (names, sizes, roles, small files' bytes on
demand); the checks never know where the files are. A place other than a plain folder is a
`PlacedPackage`: the folder to scan, where its links may lead (`bound`), the name it goes by
(`label`, the repository's `org/name`, which profile detection reads as it reads a folder's name)
and what reports call it (`where`). `hfcache.py` reads the cache's layout, `hub.py` a repository
on the Hub through huggingface_hub (metadata and small files only), `guard.py` keeps the checks from
reading files a place did not fetch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from raipack.core.package import Package
from raipack.places.hfcache import snapshot_repo

HUB_SCHEME = "hf://"


@dataclass
class PlacedPackage(Package):
    bound: Path | None = None  # links may lead anywhere in here (a cache's models--org--name folder); None: the root
    label: str | None = None  # the repository's org/name
    where: str | None = None  # what reports call the package (hf://org/name@commit); None: its folder

    @cached_property
    def real_root(self) -> str:
        return os.path.realpath(self.bound or self.root)

    @cached_property
    def name(self) -> str:
        return self.label or Path(os.path.abspath(self.root)).name


def is_hub(target) -> bool:
    """`hf://org/name[@revision]`: a repository on the Hub, not a path."""
    return isinstance(target, str) and target.startswith(HUB_SCHEME)


def where(pkg: Package) -> str:
    return getattr(pkg, "where", None) or str(pkg.root)


def scan(path: Path) -> Package:
    """A folder's package; a Hugging Face cache snapshot's links into its blobs/ are its files, and its
    repository's org/name is its name."""
    found = snapshot_repo(path)
    if found is None:
        return Package.scan(path)
    repo_id, repo_dir = found
    pkg = PlacedPackage.scan(path, bound=repo_dir, label=repo_id)
    for fe in pkg.files.values():
        fe.symlink = False  # the cache's links into blobs/ are how the files are stored, not links the package ships
    return pkg
