"""raipack's manifest.json, and content hashes (with --verify-hashes)."""

from __future__ import annotations

import subprocess

from ..hashing import sha256_many
from . import check

MANIFEST = "manifest.json"


def manifest_files(ctx) -> dict[str, dict]:
    m = ctx.pkg.try_json(MANIFEST)
    if not isinstance(m, dict) or not isinstance(m.get("files"), list):
        return {}
    return {e["path"]: e for e in m["files"] if isinstance(e, dict) and isinstance(e.get("path"), str)}


@check("RP801", "manifest")
def manifest(ctx):
    """Where a raipack `manifest.json` is present, the build that wrote it
    finished (`complete: true`), every file it lists is present with the
    recorded size, and no file of the package is missing from it. A folder
    without a complete manifest, or with raipack's `.raipack-incomplete`
    marker, is an unfinished build."""
    from ..manifest import INCOMPLETE

    if INCOMPLETE in ctx.pkg.files:
        yield ctx.finding(INCOMPLETE, "marks a folder raipack had not finished writing (the build was interrupted)", "run the build again; it picks up after the last complete stage")
    m = ctx.pkg.try_json(MANIFEST)
    if not isinstance(m, dict):
        return
    if m.get("complete") is not True:
        yield ctx.finding(MANIFEST, "does not say complete: true; the build that wrote this folder did not finish", "run the build again", "/complete")
    listed = manifest_files(ctx)
    for i, (rel, entry) in enumerate(listed.items()):
        fe = ctx.pkg.files.get(rel)
        if fe is None:
            yield ctx.finding(rel, "is listed in manifest.json but missing", "copy the complete package again", f"/files/{i}")
        elif isinstance(entry.get("size"), int) and entry["size"] != fe.size:
            yield ctx.finding(rel, f"is {fe.size} bytes; manifest.json records {entry['size']}", "the file was changed or truncated after the build; rebuild or copy it again", f"/files/{i}/size")
    for rel in ctx.pkg.files:
        if rel not in listed and rel not in (MANIFEST, INCOMPLETE):
            yield ctx.finding(rel, "is not listed in manifest.json", "remove files added after the build, or rebuild", severity="warning")


def lfs_oids_from_git(ctx) -> dict[str, str]:
    """path → sha256 recorded in the LFS pointers of a git clone's index."""
    root = ctx.pkg.root
    if not (root / ".git").exists():
        return {}
    try:
        listing = subprocess.run(["git", "-C", str(root), "ls-files", "-s"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    blobs = {}
    for line in listing.splitlines():
        meta, _, path = line.partition("\t")
        parts = meta.split()
        if len(parts) == 3 and path in ctx.pkg.files:
            blobs[path] = parts[1]
    if not blobs:
        return {}
    query = "".join(f"{b}\n" for b in blobs.values())
    try:
        out = subprocess.run(["git", "-C", str(root), "cat-file", "--batch"], input=query.encode(), capture_output=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    from ..package import parse_lfs_pointer

    oids, pos = {}, 0
    for path in blobs:
        header_end = out.index(b"\n", pos)
        size = int(out[pos:header_end].split()[2])
        body = out[header_end + 1 : header_end + 1 + size]
        pos = header_end + 1 + size + 1
        ptr = parse_lfs_pointer(body[:1024]) if size <= 1024 else None
        if ptr and ptr.oid.startswith("sha256:"):
            oids[path] = ptr.oid.split(":", 1)[1]
    return oids


@check("RP802", "content-hash", needs="verify_hashes")
def content_hash(ctx):
    """With `--verify-hashes`: each file's sha256 equals the one raipack's
    manifest.json records, or the oid of its Git LFS pointer in the package's
    git clone. Files are hashed in parallel on every core."""
    expected = {rel: e["sha256"] for rel, e in manifest_files(ctx).items() if isinstance(e.get("sha256"), str)}
    source = {rel: "manifest.json" for rel in expected}
    for rel, oid in lfs_oids_from_git(ctx).items():
        if rel not in expected:
            expected[rel], source[rel] = oid, "its Git LFS pointer"
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
