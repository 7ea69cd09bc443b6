"""`raipack publish`: a package folder's upload plan for the Hugging Face Hub, and the upload.

The plan lists each file with its size and whether git-lfs stores it (the folder's own
`.gitattributes`, matched as git matches it), the model card's metadata, and every reason the
upload would be refused: a file the Hub refuses (over 10 MiB outside LFS, binary and over 1 MB
outside LFS, over its per-file limit), a file huggingface_hub's upload_folder would refuse after
creating the repository (under a `.cache/` or `.git/` folder: pipeline/core/hubpaths.py), and what
raipack itself refuses to publish: an unfinished folder, a Git LFS pointer in place of a file, a
package that fails `raipack validate --for hub`, a credentials file (by name) or a token in a small
text file, a README whose front matter passes raipack's bounds (pipeline/core/frontmatter.py). The
upload itself goes through `huggingface_hub` (an optional dependency) and only after a plan with no
refusal; during it, a refusal by the Hub (HTTP 4xx) is one sentence and exit code 4 (PublishDenied), a
network failure, timeout, HTTP 429 or 5xx one sentence and exit code 5 (PublishFailed).
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from raipack.core import frontmatter, hubpaths, lfs, manifest
from raipack.core.errors import RaipackError, UsageError
from raipack.core.package import JSON_MAX_BYTES, Package, ReadError
from raipack.core.textsafe import safe
from raipack.validate import for_destination, validate_all

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
CARD = "README.md"
IGNORED = (".git/**", manifest.INCOMPLETE)  # never uploaded
NETWORK_MODULES = ("httpx2", "httpx", "requests.exceptions", "urllib3.exceptions")  # whose HTTPError a failed upload may raise


@dataclass
class Plan:
    root: Path
    repo_id: str | None
    files: list = field(default_factory=list)  # lfs.PlannedFile
    card: dict = field(default_factory=dict)  # the model card's front matter
    card_note: str = ""  # why the card's metadata could not be read
    refusals: list = field(default_factory=list)  # (path, reason, hint)

    @property
    def refused(self) -> bool:
        return bool(self.refusals)

    def to_dict(self) -> dict:
        return {"root": str(self.root), "repo_id": self.repo_id, "card": _plain(self.card), "card_note": self.card_note,
                "files": [{"path": f.path, "size": f.size, "lfs": f.lfs} for f in self.files],
                "refusals": [{"path": p, "reason": r, "hint": h} for p, r, h in self.refusals], "refused": self.refused}


class PublishRefused(RaipackError):
    """The plan holds a refusal: nothing was uploaded (exit code 1)."""


class PublishDenied(RaipackError):
    """The Hub answered a request of the upload with a refusal, HTTP 4xx but 429 (exit code 4, as
    validate's HubError)."""

    exit_code = 4


class PublishFailed(RaipackError):
    """The Hub could not be reached, or failed, while uploading: network, timeout, HTTP 429 or 5xx
    (exit code 5, as validate's HubUnavailable)."""

    exit_code = 5


def upload_plan(path: Path, repo_id: str | None = None) -> Plan:
    """What uploading folder `path` would send, and why the Hub or raipack would refuse it."""
    path = Path(path)
    if repo_id is not None and not REPO_ID.match(repo_id):
        raise UsageError(f"--repo is {repo_id!r}; expected a Hub repository id OWNER/NAME", "for example --repo my-org/Llama-3.2-1B-Instruct_rai_1.8.0_npu_16K")
    outcomes = for_destination(validate_all([path]), "hub")  # also the usage errors: no folder, no package (exit 3)
    if len(outcomes) != 1:
        raise UsageError(f"{path} is a folder of {len(outcomes)} packages; publish takes one package folder", f"publish each one: raipack publish {path}/NAME")
    outcome = outcomes[0]
    if isinstance(outcome, RaipackError):
        raise outcome
    pkg = Package.scan(path)
    plan = Plan(root=path, repo_id=repo_id)
    try:
        attrs = lfs.attributes_of(pkg)
    except ReadError as exc:
        raise RaipackError(f"{path / lfs.NAME} cannot be read: {exc}", exc.hint or "check the file") from None
    sent = [rel for rel in pkg.files if rel != manifest.INCOMPLETE and not hubpaths.client_ignores(rel, IGNORED)]
    plan.files = lfs.plan({rel: pkg.files[rel].size for rel in sent}, attrs, lambda rel: lfs.is_binary(pkg, rel))
    plan.refusals += client_and_secret_refusals(pkg, sent)
    for planned in plan.files:
        if planned.refused:
            plan.refusals.append((planned.path, f"the Hub refuses it: {planned.refused}", f"add this line to {lfs.NAME}: {lfs.suggested_rule(planned.path)}"))
    if pkg.has(manifest.INCOMPLETE):
        plan.refusals.append((manifest.INCOMPLETE, "raipack refuses it: the folder is an unfinished build", "build the package again and publish the finished folder"))
    for fe in pkg.files.values():
        if fe.lfs:
            plan.refusals.append((fe.rel, "raipack refuses it: it is a Git LFS pointer, not the file", "run `git lfs pull` in the clone before publishing"))
    for f in outcome.findings:
        if f.severity == "error" and f.check_id != "RP110":  # RP110's files are listed above
            plan.refusals.append((f.path, f"raipack refuses it: {f.check_id} {f.message}", f.hint))
    try:
        plan.card, plan.card_note = card_metadata(pkg)
    except frontmatter.FrontMatterRefused as exc:
        plan.card_note = str(exc)
        plan.refusals.append((CARD, f"raipack refuses it: {exc}", exc.hint))
    return plan


def client_and_secret_refusals(pkg: Package, sent: list[str]) -> list[tuple[str, str, str]]:
    """The files huggingface_hub's upload_folder would refuse after creating the repository, and the
    credentials (by name, or a token's shape in a small text file) raipack never uploads."""
    out: list[tuple[str, str, str]] = []
    refused_folders: dict[str, list[str]] = {}  # folder -> the files under it the client refuses (one line per folder)
    for rel in sorted(sent):
        folder = hubpaths.client_refuses(rel)
        if folder:
            parts = rel.split("/")
            refused_folders.setdefault("/".join(parts[: parts.index(folder) + 1]), []).append(rel)
            continue
        pattern = hubpaths.secret_name(rel)
        if pattern:
            out.append((rel, f"raipack refuses it: its name is that of a credentials file ({pattern})", "remove it from the package folder; if it held a real token, revoke that token"))
            continue
        fe = pkg.files[rel]
        if fe.size > hubpaths.content_limit() or fe.lfs or lfs.is_binary(pkg, rel):
            continue
        try:
            what = hubpaths.secret_in(pkg.scanned_bytes(rel, hubpaths.content_limit(), "text file"))
        except ReadError:
            continue  # the scan or validation names the file
        if what:
            out.append((rel, f"raipack refuses it: it holds what looks like {what}", "remove the secret from the file (and revoke it if it is real), then publish again"))
    for folder, files in refused_folders.items():
        name = folder.rsplit("/", 1)[-1]
        out.insert(0, (folder + ("/" if files != [folder] else ""), f"the Hub's client refuses {'it' if files == [folder] else f'its {len(files)} file(s)'}: huggingface_hub's upload_folder commits no file under a {name!r} folder (it raises ValueError after creating the repository)",
                       "publish this folder with git and git-lfs (clone the Hub repository, copy the files in, push), or keep such files out of the package"))
    return out


def card_metadata(pkg: Package) -> tuple[dict, str]:
    """(the model card's YAML front matter, "") or ({}, why there is none)."""
    if not pkg.has(CARD):
        return {}, f"no {CARD}: the Hub shows the repository without a model card"
    try:
        text = pkg.read_bytes(CARD, JSON_MAX_BYTES, "model card").decode("utf-8", "replace")
    except ReadError as exc:
        return {}, f"{CARD} {exc}"
    front, _ = frontmatter.split(text)
    if front is None:
        return {}, f"{CARD} has no YAML front matter (the Hub's model card metadata)"
    try:
        import yaml  # noqa: F401  (optional dependency: the light install has none)
    except ImportError:
        return {}, f"{CARD} has front matter; install pyyaml to show it"
    try:
        doc = frontmatter.load(front, CARD)
    except frontmatter.FrontMatterInvalid as exc:
        return {}, str(exc)
    return (doc, "") if isinstance(doc, dict) else ({}, f"{CARD}'s front matter is not a mapping")


def as_text(plan: Plan, dry_run: bool) -> str:
    target = plan.repo_id or "(no --repo given)"
    lines = [f"Upload plan for {safe(str(plan.root))} -> {target}" + (" (dry run: nothing is uploaded)" if dry_run else ""), "",
             f"  {'size':>10}  {'storage':<7}  file"]
    for f in plan.files:
        lines.append(f"  {_size(f.size):>10}  {'LFS' if f.lfs else 'git':<7}  {safe(f.path)}")
    lines += ["", "Model card metadata:"]
    if plan.card:
        lines += [f"  {safe(str(k))}: {safe(_short(v))}" for k, v in plan.card.items()]
    else:
        lines.append(f"  none: {safe(plan.card_note)}")
    total = sum(f.size for f in plan.files)
    in_lfs = [f for f in plan.files if f.lfs]
    lines += ["", f"{len(plan.files)} files, {_size(total)}; {len(in_lfs)} in LFS ({_size(sum(f.size for f in in_lfs))})."]
    if plan.refused:
        lines.append(f"REFUSED: {len(plan.refusals)} problem(s), nothing {'would be' if dry_run else 'was'} uploaded:")
        for path, reason, hint in plan.refusals:
            lines.append(f"  {safe(path) or '(package)'}: {safe(reason)}")
            if hint:
                lines.append(f"    hint: {safe(hint)}")
    else:
        lines.append("The Hub would take every file." if dry_run else "Uploading.")
    return "\n".join(lines) + "\n"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _plain(value):
    """A front matter's values as JSON takes them: keys as text, NaN and infinities as text (the
    front matter is bounded in depth and size before it gets here)."""
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _short(value) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def upload(plan: Plan, private: bool = False, revision: str | None = None) -> str:
    """Upload a plan without refusals with huggingface_hub; the URL of the commit."""
    if plan.refused:
        raise PublishRefused(f"{plan.root} is not uploaded: {plan.refusals[0][0]}: {plan.refusals[0][1]}", plan.refusals[0][2])
    if not plan.repo_id:
        raise UsageError("publishing needs the Hub repository: --repo OWNER/NAME", "or add --dry-run to see the plan only")
    try:
        import huggingface_hub
    except ImportError:
        raise UsageError("uploading needs the huggingface_hub package, which is not installed", "pip install 'raipack[hub]', or add --dry-run") from None
    token = os.environ.get("HF_TOKEN") or huggingface_hub.get_token()
    if not token:
        raise UsageError("uploading needs a Hugging Face token: HF_TOKEN is not set and no token is stored", "set HF_TOKEN (a token with write access), or run `hf auth login`")
    api = huggingface_hub.HfApi(token=token)
    step = "creating the repository"
    try:
        api.create_repo(plan.repo_id, repo_type="model", private=private, exist_ok=True)
        step = "uploading the files"
        info = api.upload_folder(folder_path=str(plan.root), repo_id=plan.repo_id, repo_type="model", revision=revision,
                                 ignore_patterns=list(IGNORED), commit_message=f"Upload {plan.root.name} with raipack")
    except _network_errors() as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if isinstance(status, int) and 400 <= status < 500 and status != 429:
            raise PublishDenied(f"the Hub refused publishing {plan.root} to {plan.repo_id} while {step} (HTTP {status}): {_first_line(exc)}",
                                "check the repository name and that the token (HF_TOKEN or `hf auth login`) has write access to it") from None
        raise PublishFailed(f"publishing {plan.root} to {plan.repo_id} failed while {step}: {_first_line(exc)}",
                            "check the network and HF_ENDPOINT, then run the same command again (files already on the Hub are not sent twice)") from None
    return str(getattr(info, "commit_url", info))


def _network_errors() -> tuple[type[BaseException], ...]:
    """What a failed request raises through huggingface_hub: its HTTP errors (OSError subclasses),
    OSError and ConnectionError, and the HTTP libraries' own error bases (httpx's HTTPError is not
    an OSError; requests' RequestException is). The libraries are looked up among the modules
    huggingface_hub imported, so raipack imports none of them."""
    kinds: list[type[BaseException]] = [OSError]
    for name in NETWORK_MODULES:
        base = getattr(sys.modules.get(name), "HTTPError", None)
        if isinstance(base, type) and issubclass(base, BaseException):
            kinds.append(base)
    return tuple(kinds)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text.splitlines()[0]}"
