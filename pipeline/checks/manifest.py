"""raipack's manifest.json, and content hashes (with --verify-hashes)."""

from __future__ import annotations

import os

from raipack.checks.base import check
from raipack.core.hashing import sha256_many
from raipack.core.manifest import INCOMPLETE
from raipack.core.package import LFS_MAX_SIZE, parse_lfs_pointer

MANIFEST = "manifest.json"


def manifest_entries(ctx) -> list[tuple[int, dict]]:
    """(index in `files`, entry) of each manifest entry that names a path."""
    m = ctx.pkg.try_json(MANIFEST)
    if not isinstance(m, dict) or not isinstance(m.get("files"), list):
        return []
    return [(i, e) for i, e in enumerate(m["files"]) if isinstance(e, dict) and isinstance(e.get("path"), str)]


def manifest_files(ctx) -> dict[str, dict]:
    return {e["path"]: e for _, e in manifest_entries(ctx)}


@check("RP801", "manifest")
def manifest(ctx):
    """Where a raipack `manifest.json` is present, the build that wrote it
    finished (`complete: true`), every file it lists is present with the
    recorded size, no path is listed twice, and no file of the package is
    missing from it. A folder without a complete manifest, or with raipack's
    `.raipack-incomplete` marker, is an unfinished build."""
    if INCOMPLETE in ctx.pkg.files:
        yield ctx.finding(INCOMPLETE, "marks a folder raipack had not finished writing (the build was interrupted)", "run the build again; it picks up after the last complete stage")
    m = ctx.pkg.try_json(MANIFEST)
    if not isinstance(m, dict):
        return
    if m.get("complete") is not True:
        yield ctx.finding(MANIFEST, "does not say complete: true; the build that wrote this folder did not finish", "run the build again", "/complete")
    listed, first = manifest_files(ctx), {}
    for i, entry in manifest_entries(ctx):
        rel = entry["path"]
        if rel in first:
            yield ctx.finding(rel, f"is listed twice in manifest.json, at /files/{first[rel]} and /files/{i}", "rebuild the package; a manifest lists each file once", f"/files/{i}")
            continue
        first[rel] = i
        fe = ctx.pkg.files.get(rel)
        if fe is None:
            yield ctx.finding(rel, "is listed in manifest.json but missing", "copy the complete package again", f"/files/{i}")
        elif isinstance(entry.get("size"), int) and entry["size"] != fe.size:
            yield ctx.finding(rel, f"is {fe.size} bytes; manifest.json records {entry['size']}", "the file was changed or truncated after the build; rebuild or copy it again", f"/files/{i}/size")
    for rel in ctx.pkg.files:
        if rel not in listed and rel not in (MANIFEST, INCOMPLETE):
            yield ctx.finding(rel, "is not listed in manifest.json", "remove files added after the build, or rebuild", severity="warning")


def lfs_oids_from_git(ctx, paths) -> tuple[dict[str, str], list]:
    """path -> sha256 recorded in the Git LFS pointers that a git clone's index
    holds for `paths`, and findings for what could not be read. The index and
    objects are read as files (pipeline/core/gitread.py): git itself never runs in
    a package, so nothing its `.git/config` or hooks name can run."""
    # late: only a package inside a git work tree reads git objects; validate of a plain folder skips the git reader
    from raipack.core.gitread import GitReadError, MissingObject, NotFollowed, Repo

    if not os.path.lexists(ctx.pkg.root / ".git"):
        return {}, []
    oids, findings = {}, []
    try:
        with Repo(ctx.pkg.root) as repo:
            blobs = {rel: oid for rel, oid in repo.index().items() if rel in paths}
            for rel, oid in blobs.items():
                try:
                    body = repo.small_blob(oid, LFS_MAX_SIZE)
                except MissingObject:
                    borrowed = "; the clone borrows objects from another repository (objects/info/alternates), which raipack does not read" if repo.has_alternates else ""
                    findings.append(ctx.finding(rel, f"has no blob {oid.hex()} in the package's git clone (a partial or shallow clone lacks it){borrowed}, so its Git LFS oid was not checked", "fetch the missing objects, or clone the package again without --filter", severity="warning"))
                    continue
                except GitReadError as exc:
                    findings.append(ctx.finding(rel, f"has a blob in the package's git clone that cannot be read: {exc}; its Git LFS oid was not checked", "clone the package again", severity="warning"))
                    continue
                ptr = parse_lfs_pointer(body) if body is not None else None
                if ptr and ptr.oid.startswith("sha256:"):
                    oids[rel] = ptr.oid.split(":", 1)[1]
    except NotFollowed as exc:
        findings.append(ctx.finding(".git", f"{exc}; no Git LFS oids were read", "validate the clone itself, where .git is a folder", severity="info"))
    except GitReadError as exc:
        findings.append(ctx.finding(".git", f"cannot be read as a git clone: {exc}; no Git LFS oids were checked", "clone the package again", severity="warning"))
    except OSError as exc:
        findings.append(ctx.finding(".git", f"cannot be read: {exc.strerror or exc}; no Git LFS oids were checked", "check its permissions", severity="warning"))
    return oids, findings


def written_by_raipack(ctx) -> bool:
    """manifest.json is raipack's own (format raipack-manifest, generator raipack): it lists every file raipack wrote."""
    m = ctx.pkg.try_json(MANIFEST)
    gen = m.get("generator") if isinstance(m, dict) else None
    return isinstance(m, dict) and m.get("format") == "raipack-manifest" and isinstance(gen, dict) and gen.get("name") == "raipack"


@check("RP802", "content-hash", needs="verify_hashes")
def content_hash(ctx):
    """With `--verify-hashes`: each file's sha256 equals the one raipack's
    manifest.json records, or the oid of its Git LFS pointer in the package's
    git clone, or the LFS sha256 the Hub records for it (a Hugging Face cache
    snapshot, whose blobs are named by it; hf://, for the files downloaded). In a folder whose manifest.json is raipack's (it lists every
    file raipack wrote), a file it does not list, or lists without a sha256,
    is an error: its content cannot be verified (without `--verify-hashes`,
    RP801 warns). Files are hashed in parallel on every core. The clone's index
    and objects are read as plain files: git never runs in a package, so
    nothing its `.git/config` or hooks name can run."""
    expected = {rel: e["sha256"] for rel, e in manifest_files(ctx).items() if isinstance(e.get("sha256"), str)}
    source = {rel: "manifest.json" for rel in expected}
    unrecorded = {rel for rel, fe in ctx.pkg.files.items() if rel not in expected and not fe.lfs}
    if written_by_raipack(ctx):  # raipack lists every file it writes: one it does not list has no digest to hold it to
        for rel in sorted(set(ctx.pkg.files) - set(expected) - {MANIFEST, INCOMPLETE}):
            yield ctx.finding(rel, "has no sha256 in manifest.json, which raipack wrote listing every file of the folder: it was added, or its entry removed, "
                                   "after the build, so its content cannot be verified", "rebuild the package, or copy it again with its manifest.json")
        unrecorded = set()
    git_oids, git_findings = lfs_oids_from_git(ctx, unrecorded)
    yield from git_findings
    for rel, oid in git_oids.items():
        expected[rel], source[rel] = oid, "its Git LFS pointer"
    for rel, oid in getattr(ctx.pkg, "hub_sha256", {}).items():  # a Hugging Face cache snapshot or Hub repository (pipeline/places/)
        if rel in unrecorded and rel not in expected:
            expected[rel], source[rel] = oid, "the Hub's LFS record"
    todo = [rel for rel in expected if rel in ctx.pkg.files and not ctx.pkg.files[rel].lfs]
    if not expected:
        yield ctx.finding("", "has no recorded hashes to verify (no raipack manifest.json, no Git LFS pointers in a git clone)", "drop --verify-hashes, or validate a package raipack built", severity="info")
        return
    paths = {ctx.pkg.path(rel): rel for rel in todo}
    for path, digest in sha256_many(list(paths), ctx.jobs).items():
        rel = paths[path]
        if isinstance(digest, OSError):
            yield ctx.finding(rel, f"cannot be read to hash it: {digest.strerror or digest}", "check its permissions")
        elif digest != expected[rel]:
            yield ctx.finding(rel, f"has sha256 {digest[:16]}…, not the {expected[rel][:16]}… that {source[rel]} records", "the file is corrupt or was replaced; copy it again")
