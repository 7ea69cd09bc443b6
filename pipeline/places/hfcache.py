"""The Hugging Face cache as a place: the layout huggingface_hub writes and lemonade reads.

    <cache>/models--<org>--<name>/refs/<ref>                 the commit a branch or tag stands for
    <cache>/models--<org>--<name>/snapshots/<commit>/<file>  a link to ../../blobs/<etag>
    <cache>/models--<org>--<name>/blobs/<etag>               the bytes (an LFS file's etag is its sha256)

A snapshot is a package whose files are links into its repository's blobs/ (a link that leaves the
repository folder is still refused: pipeline/core/package.py); the repository's `org/name`, not the
commit hash the snapshot folder is named by, is the name its release is read from. The cache's root
is found by huggingface_hub itself (`huggingface_hub.constants.HF_HUB_CACHE`: HF_HUB_CACHE, else
HF_HOME/hub, else ~/.cache/huggingface/hub), as lemonade finds it when its `models_dir` is `auto`
(lemonade-sdk/lemonade src/cpp/server/utils/path_utils.cpp resolve_hf_cache_dir).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from raipack.core.errors import UsageError

PREFIX = "models--"  # huggingface_hub's repo_folder_name for repo_type model
SEPARATOR = "--"  # huggingface_hub.constants.REPO_ID_SEPARATOR
COMMIT = re.compile(r"^[0-9a-f]{40}$")
MAX_REF_BYTES = 1024


def repo_id_of(folder_name: str) -> str | None:
    """`models--amd--Qwen3-4B` → `amd/Qwen3-4B`; None for a folder of another kind."""
    if not folder_name.startswith(PREFIX) or len(folder_name) == len(PREFIX):
        return None
    return "/".join(folder_name[len(PREFIX):].split(SEPARATOR))


def snapshot_repo(path: Path) -> tuple[str, Path] | None:
    """(org/name, the repository folder) when `path` is a snapshot folder of a Hugging Face cache."""
    path = Path(os.path.abspath(path))
    repo_dir = path.parent.parent
    if path.parent.name != "snapshots" or not (repo_dir / "blobs").is_dir():
        return None
    repo_id = repo_id_of(repo_dir.name)
    return (repo_id, repo_dir) if repo_id else None


def is_repo_folder(path: Path) -> bool:
    return repo_id_of(Path(path).name) is not None and (Path(path) / "snapshots").is_dir()


def is_cache_root(path: Path) -> bool:
    """A folder holding models--org--name folders (and no package of its own)."""
    try:
        with os.scandir(path) as it:
            return any(is_repo_folder(Path(e.path)) for e in it if e.is_dir(follow_symlinks=False))
    except OSError:
        return False


def _ref(repo_dir: Path, name: str) -> str | None:
    try:
        with open(repo_dir / "refs" / name, "rb") as fh:
            text = fh.read(MAX_REF_BYTES).decode("ascii", "replace").strip()
    except OSError:
        return None
    return text if COMMIT.match(text) else None


def snapshot_of(repo_dir: Path, revision: str | None = None) -> Path:
    """The snapshot folder of `revision` (a commit, or a branch or tag under refs/; default main)."""
    repo_dir = Path(repo_dir)
    wanted = revision or "main"
    commit = wanted if COMMIT.match(wanted) else _ref(repo_dir, wanted)
    if commit is None or not (repo_dir / "snapshots" / commit).is_dir():
        have = sorted(p.name for p in (repo_dir / "snapshots").iterdir() if p.is_dir())
        raise UsageError(f"{repo_dir} has no snapshot of revision {wanted!r} (refs/{wanted} is missing or names no snapshot folder)",
                         f"give one of its snapshots with --revision: {', '.join(have) or 'none is cached'}")
    return repo_dir / "snapshots" / commit


def snapshots(path: Path, revision: str | None = None) -> list[Path] | None:
    """The snapshot folders `path` stands for: a models--org--name folder its revision's (refs/main by
    default), a cache root each repository's refs/main (a repository without one: each snapshot it holds);
    None when `path` is neither."""
    path = Path(path)
    if is_repo_folder(path):
        return [snapshot_of(path, revision)]
    if not is_cache_root(path):
        return None
    out: list[Path] = []
    for repo_dir in sorted(p for p in path.iterdir() if is_repo_folder(p)):
        if revision or _ref(repo_dir, "main"):
            try:
                out.append(snapshot_of(repo_dir, revision))
            except UsageError:
                continue  # with --revision, the repositories that lack it are not this run's
        else:
            out += sorted(p for p in (repo_dir / "snapshots").iterdir() if p.is_dir())
    return out


def default_root() -> Path:
    """The cache huggingface_hub uses here (its own constant: HF_HUB_CACHE, HF_HOME/hub or the default)."""
    try:
        from huggingface_hub import constants  # the hub extra: the light install has none
    except ImportError:
        raise UsageError("--hf-cache needs huggingface_hub to find the cache as it does", "pip install 'raipack[hub]', or give the cache folder as a PATH") from None
    return Path(constants.HF_HUB_CACHE)
