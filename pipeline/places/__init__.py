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
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from raipack.core.package import Package
from raipack.places.hfcache import snapshot_repo

HUB_SCHEME = "hf://"
SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class PlacedPackage(Package):
    bound: Path | None = None  # links may lead anywhere in here (a cache's models--org--name folder); None: the root
    label: str | None = None  # the repository's org/name
    where: str | None = None  # what reports call the package (hf://org/name@commit); None: its folder
    hub_sha256: dict[str, str] = field(default_factory=dict)  # rel -> the Hub's LFS sha256 of a file that is here (RP802 holds it to it)

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
    path = Path(path)
    for fe in pkg.files.values():
        fe.symlink = False  # the cache's links into blobs/ are how the files are stored, not links the package ships
        blob = os.path.basename(os.readlink(path / fe.rel)) if os.path.islink(path / fe.rel) else ""
        if SHA256.match(blob):  # huggingface_hub names an LFS file's blob by its sha256 (the X-Linked-Etag), a git blob by its sha1
            pkg.hub_sha256[fe.rel] = blob
    return pkg
