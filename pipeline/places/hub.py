"""A repository on the Hugging Face Hub as a place: `hf://org/name[@revision]`, read through huggingface_hub.

One `model_info(files_metadata=True)` request gives the commit and every file with its size and, for
an LFS file, its sha256. The small files (configs, the NPU header, meta files: pipeline/data/places.json
says which, within a byte budget) are downloaded with `hf_hub_download` into a temporary cache; every
other file becomes a placeholder of its real size (sparse). The package is that temporary folder,
named by the repository (so its release is read from `org/name`) and reported as
`hf://org/name@<commit>`. Nothing large is downloaded; pipeline/places/guard.py refuses the checks'
reads of placeholders and reports those checks as skipped.

The Hub's refusals and a missing network are `HubError` (exit code 4: not found, private, gated, no such
revision) and `HubUnavailable` (exit code 5: no network, rate limit, server error), one sentence each.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from raipack.core.errors import RaipackError, UsageError
from raipack.core.package import role_of
from raipack.data import load_data
from raipack.places import HUB_SCHEME, PlacedPackage, guard

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
DOWNLOAD_THREADS = 4
LOGIN_HINT = "log in with `hf auth login` or set HF_TOKEN to a token that may read it"


class HubError(RaipackError):
    """The Hub refused the repository (exit code 4)."""

    exit_code = 4


class HubUnavailable(RaipackError):
    """The Hub could not be asked: network, rate limit, server error (exit code 5)."""

    exit_code = 5


@dataclass
class Remote:
    """A Hub repository laid out as a folder: the fetched files and a placeholder for every other."""

    repo_id: str
    commit: str
    folder: Path
    placeholders: dict[str, str] = field(default_factory=dict)  # absolute path -> rel
    sizes: dict[str, int] = field(default_factory=dict)  # rel -> size on the Hub
    sha256: dict[str, str] = field(default_factory=dict)  # rel -> the Hub's LFS sha256
    fetched_bytes: int = 0

    @property
    def where(self) -> str:
        return f"{HUB_SCHEME}{self.repo_id}@{self.commit}"

    def why(self, rels: list[str]) -> str:
        """The sentence a skipped check gets."""
        listed = ", ".join(f"{rel} ({_size(self.sizes.get(rel, 0))})" for rel in rels[:3]) + (f" and {len(rels) - 3} more" if len(rels) > 3 else "")
        return f"it reads {listed}, which validating {HUB_SCHEME}{self.repo_id} does not download"


def _size(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def parse(target: str) -> tuple[str, str | None]:
    """`hf://org/name[@revision]` → (org/name, revision or None); a malformed one is a usage error."""
    body = target[len(HUB_SCHEME):]
    repo_id, _, revision = body.partition("@")
    repo_id = repo_id.strip("/")
    if not REPO_ID.match(repo_id) or "--" in repo_id or ".." in repo_id or (_ and not revision):
        raise UsageError(f"{target!r} is not a Hub repository name", "write hf://org/name, or hf://org/name@revision for a branch, tag or commit")
    return repo_id, revision or None


def plan(files: dict[str, int]) -> list[str]:
    """The files to download: the roles of places.json's tiers in order, smallest first within a tier,
    while the bytes stay within the budget and the count within max_files."""
    rules = load_data("places.json")["hub"]
    tier_of = {role: i for i, roles in enumerate(rules["tiers"]) for role in roles}
    ranked = sorted((tier_of[role_of(rel)], size, rel) for rel, size in files.items() if role_of(rel) in tier_of and size > 0)
    chosen, spent = [], 0
    for _tier, size, rel in ranked:
        if spent + size <= rules["budget_bytes"] and len(chosen) < rules["max_files"]:
            chosen.append(rel)
            spent += size
    return chosen


def _listing(info) -> dict[str, tuple[int, str | None]]:
    """rel -> (size, LFS sha256) of a model_info's siblings; a path that would leave the folder is refused."""
    out = {}
    for sib in info.siblings or []:
        rel = sib.rfilename
        parts = PurePosixPath(rel).parts
        if not rel or rel.startswith("/") or ".." in parts or "\\" in rel or ".git" in parts[:1]:
            raise HubError(f"the Hub lists a file {rel!r} for {info.id}, a path outside the repository", "report it to the repository's owner")
        out[rel] = (int(sib.size or 0), sib.lfs.sha256 if sib.lfs else None)
    return out


@contextmanager
def fetched(target: str, revision: str | None = None):
    """The repository of `target` as a Remote (its temporary folder removed afterwards)."""
    repo_id, named = parse(target)
    revision = named or revision
    tmp = Path(tempfile.mkdtemp(prefix="raipack-hub-"))
    try:
        yield _fetch(repo_id, revision, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _fetch(repo_id: str, revision: str | None, tmp: Path) -> Remote:
    try:
        from huggingface_hub import HfApi, hf_hub_download  # the hub extra: imported only for hf://, the light install has none
    except ImportError:
        raise UsageError(f"{HUB_SCHEME}{repo_id} is read through huggingface_hub, which is not installed here", "pip install 'raipack[hub]'") from None

    with hub_errors(repo_id, revision):
        info = HfApi().model_info(repo_id, revision=revision, files_metadata=True)
    listing = _listing(info)
    remote = Remote(repo_id, info.sha or revision or "main", Path(os.path.realpath(tmp / "package")))
    remote.folder.mkdir()
    remote.sizes = {rel: size for rel, (size, _) in listing.items()}
    remote.sha256 = {rel: sha for rel, (_, sha) in listing.items() if sha}
    wanted = plan(remote.sizes)

    def download(rel: str) -> str:
        with hub_errors(repo_id, revision):
            return hf_hub_download(repo_id, rel, revision=remote.commit, cache_dir=tmp / "cache")

    with ThreadPoolExecutor(DOWNLOAD_THREADS) as pool:  # a few small files at once: the requests' latency, not bandwidth, is the cost
        got = dict(zip(wanted, pool.map(download, wanted)))
    for rel, (size, _sha) in sorted(listing.items()):
        dest = remote.folder / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if rel in got:
            shutil.copyfile(got[rel], dest)
            remote.fetched_bytes += dest.stat().st_size
            continue
        with open(dest, "wb") as fh:
            fh.truncate(size)  # sparse: the Hub's size, no bytes
        if size:
            remote.placeholders[str(dest)] = rel
    return remote


def open_remote(remote: Remote) -> PlacedPackage:
    """The package of a fetched repository, scanned with its placeholders guarded (their scan findings,
    which only say a placeholder could not be read, dropped)."""
    with guard.watch(remote.placeholders):
        pkg = PlacedPackage.scan(remote.folder, label=remote.repo_id, where=remote.where)
    held = set(remote.placeholders.values())
    pkg.scan_findings = [f for f in pkg.scan_findings if f.path not in held]
    pkg.hub_sha256 = {rel: sha for rel, sha in remote.sha256.items() if rel not in held}
    return pkg


@contextmanager
def hub_errors(repo_id: str, revision: str | None):
    """huggingface_hub's and the network's exceptions as one sentence each."""
    from huggingface_hub import errors  # the hub extra (see _fetch)

    try:
        yield
    except errors.GatedRepoError:
        raise HubError(f"{HUB_SCHEME}{repo_id} is gated: the Hub serves its files only to accounts granted access (HTTP 403)",
                       f"request access on the repository's page, then {LOGIN_HINT}") from None
    except errors.RevisionNotFoundError:
        raise HubError(f"{HUB_SCHEME}{repo_id} has no revision {revision!r} on the Hub (HTTP 404)", "give an existing branch, tag or commit after @") from None
    except (errors.RepositoryNotFoundError, errors.HfHubHTTPError) as exc:
        raise _http_error(exc, repo_id) from None
    except errors.LocalEntryNotFoundError:
        raise HubUnavailable(f"a file of {HUB_SCHEME}{repo_id} could not be downloaded: the Hub did not answer", "check the network (and HF_ENDPOINT), then try again") from None
    except errors.OfflineModeIsEnabled:
        raise HubUnavailable(f"{HUB_SCHEME}{repo_id} cannot be asked for: HF_HUB_OFFLINE is set", "unset HF_HUB_OFFLINE, or validate a cached snapshot folder") from None
    except Exception as exc:
        if not _is_transport_error(exc):
            raise
        from huggingface_hub import constants

        raise HubUnavailable(f"the Hub at {constants.ENDPOINT} cannot be reached for {HUB_SCHEME}{repo_id} ({type(exc).__name__}: {exc})",
                             "check the network (and HF_ENDPOINT), or validate a cached snapshot folder") from None


def _http_error(exc, repo_id: str) -> RaipackError:
    from huggingface_hub import errors  # the hub extra (see _fetch)

    status = getattr(getattr(exc, "response", None), "status_code", None)
    name = f"{HUB_SCHEME}{repo_id}"
    if isinstance(exc, errors.RepositoryNotFoundError):
        if status == 401:
            return HubError(f"{name} was not found or is private: the Hub answered HTTP 401 to this machine's credentials", f"check the name; if it is private, {LOGIN_HINT}")
        return HubError(f"{name} does not exist on the Hub (HTTP {status or 404})", "check the name (org/name, as on the repository's page)")
    if status == 401:
        return HubError(f"the Hub refused this machine's token for {name} (HTTP 401)", LOGIN_HINT)
    if status == 403:
        return HubError(f"the Hub refused access to {name} (HTTP 403)", LOGIN_HINT)
    if status == 429:
        return HubUnavailable(f"the Hub's rate limit was reached while reading {name} (HTTP 429)", "wait a few minutes and try again; requests with a token have a larger quota")
    return HubUnavailable(f"the Hub answered HTTP {status} while reading {name}", "try again later")


def _is_transport_error(exc: Exception) -> bool:
    """A connection refused, a timeout, a name that does not resolve: the HTTP client's transport errors."""
    return any(cls.__name__ in ("TransportError", "ConnectError", "TimeoutException") for cls in type(exc).__mro__) or isinstance(exc, ConnectionError)
