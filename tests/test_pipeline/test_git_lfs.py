"""--verify-hashes reads a package's git clone without running git in it, and
raipack's manifest lists each file once.

The repositories here are made with the real `git` (run in the tests' own
temporary repositories, with no global or system configuration); raipack
itself must never run git in a package (pipeline/core/gitread.py reads the files).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import stat
import subprocess
from pathlib import Path

import pytest

from factory import lfs_pointer_text
from helpers import edit_json
from raipack.checks import load_all
from raipack.checks.manifest import lfs_oids_from_git
from raipack.cli import main
from raipack.core import gitpack, gitread
from raipack.validate import open_package, validate

P16 = "1.8.0-npu-16K"
GIT_ENV = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
pytestmark = pytest.mark.skipif(subprocess.run(["git", "--version"], capture_output=True).returncode != 0, reason="git is not installed")


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main", *args],
                          cwd=repo, env=GIT_ENV, capture_output=True, text=True, check=True)
    return proc.stdout


def commit_all(pkg: Path, *init_args: str) -> None:
    git(pkg, "init", "-q", *init_args)
    git(pkg, "add", "-A")
    git(pkg, "commit", "-qm", "package")


def lfs_clone(pkg: Path, rel: str = "model.bin", *init_args: str, history: bool = False) -> str:
    """Commit `rel` as a Git LFS pointer to its current content (as `git lfs`
    leaves a clone after `git lfs pull`), then put the content back."""
    real = (pkg / rel).read_bytes()
    oid = hashlib.sha256(real).hexdigest()
    pointer = lfs_pointer_text(len(real), oid)
    if history:  # older, larger versions: the committed pointer becomes a delta in a pack
        git(pkg, "init", "-q", *init_args)
        for n in (2, 1):
            (pkg / rel).write_text(pointer + "#" * 400 * n + "\n")
            git(pkg, "add", "-A")
            git(pkg, "commit", "-qm", f"v{n}")
    (pkg / rel).write_text(pointer)
    if history:
        git(pkg, "add", "-A")
        git(pkg, "commit", "-qm", "pointer")
    else:
        commit_all(pkg, *init_args)
    (pkg / rel).write_bytes(real)
    return oid


def oids(pkg: Path) -> tuple[dict, list]:
    ctx, _ = open_package(pkg, verify_hashes=True)
    ctx.current = load_all()["RP802"]
    return lfs_oids_from_git(ctx, set(ctx.pkg.files))


def rp802(result) -> list:
    return [(f.severity, f.path, f.message) for f in result.findings if f.check_id == "RP802"]


def test_fsmonitor_hooks_and_filters_in_the_package_never_run(make_pkg, tmp_path, capsys):
    """The issue's attack, exactly: a core.fsmonitor command in the package's
    .git/config ran when `validate --verify-hashes` called git there."""
    pkg = make_pkg(P16)
    commit_all(pkg)
    marker = tmp_path / "marker-hook"
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for d in (pkg / ".git" / "hooks", hooks):
        for name in ("post-checkout", "post-index-change", "reference-transaction", "pre-commit"):
            (d / name).write_text(f"#!/bin/sh\ntouch {marker}\n")
            (d / name).chmod(0o755)
    (pkg / ".gitattributes").write_text("* filter=evil\n")
    git(pkg, "config", "filter.evil.clean", f"touch {marker}; cat")
    git(pkg, "config", "filter.evil.smudge", f"touch {marker}; cat")
    git(pkg, "config", "core.fsmonitor", "touch MARKER; echo")
    # the trap is armed: git itself, run in the package, runs the command
    subprocess.run(["git", "-C", str(pkg), "ls-files", "-s"], env=GIT_ENV, capture_output=True)
    assert (pkg / "MARKER").exists()
    (pkg / "MARKER").unlink()
    git(pkg, "config", "core.hooksPath", str(hooks))
    with pytest.raises(SystemExit) as info:
        main(["validate", str(pkg), "--verify-hashes"])
    assert not (pkg / "MARKER").exists(), "core.fsmonitor ran"
    assert not marker.exists(), "a hook or filter ran"
    assert info.value.code == 0, capsys.readouterr()


@pytest.mark.parametrize("init_args, index_version", [((), 2), ((), 3), ((), 4), (("--object-format=sha256",), 4)], ids=["v2", "v3", "v4", "sha256-v4"])
def test_lfs_oids_from_loose_objects(make_pkg, init_args, index_version):
    pkg = make_pkg(P16)
    oid = lfs_clone(pkg, "model.bin", *init_args)
    if index_version == 3:
        git(pkg, "update-index", "--skip-worktree", "cache/MatMulNBits_0_0_wts.const")  # extended flags: version 3
    git(pkg, "update-index", "--index-version", str(index_version))
    assert (pkg / ".git" / "index").read_bytes()[4:8] == index_version.to_bytes(4, "big")
    found, findings = oids(pkg)
    assert found == {"model.bin": oid} and findings == []
    assert [f for f in validate(pkg, verify_hashes=True).findings if f.severity == "error"] == []


def test_mismatch_with_the_lfs_oid_is_an_error(make_pkg):
    pkg = make_pkg(P16)
    lfs_clone(pkg)
    data = bytearray((pkg / "model.bin").read_bytes())
    data[100] ^= 0xFF
    (pkg / "model.bin").write_bytes(data)
    hits = rp802(validate(pkg, verify_hashes=True))
    assert [(s, p) for s, p, _ in hits] == [("error", "model.bin")]
    assert "Git LFS pointer" in hits[0][2]


@pytest.mark.parametrize("offset_deltas", [True, False], ids=["ofs-delta", "ref-delta"])
def test_lfs_oids_from_a_packed_repository_with_deltas(make_pkg, offset_deltas):
    pkg = make_pkg(P16)
    oid = lfs_clone(pkg, history=True)
    git(pkg, "-c", f"repack.useDeltaBaseOffset={str(offset_deltas).lower()}", "repack", "-adq", "--window=50")
    git(pkg, "prune-packed")
    blob = bytes.fromhex(git(pkg, "rev-parse", ":model.bin").strip())
    assert not (pkg / ".git" / "objects" / blob.hex()[:2] / blob.hex()[2:]).exists()
    with gitread.Repo(pkg) as repo:  # the committed pointer is stored as a delta of the kind asked for
        pack = next(p for p in repo.packs() if p.find(blob) is not None)
        kind = pack.header(pack.find(blob))[0]
    assert kind == (gitpack.OFS_DELTA if offset_deltas else gitpack.REF_DELTA)
    found, findings = oids(pkg)
    assert found == {"model.bin": oid} and findings == []
    (pkg / "model.bin").write_bytes(b"\0" * (pkg / "model.bin").stat().st_size)
    assert [(s, p) for s, p, _ in rp802(validate(pkg, verify_hashes=True))] == [("error", "model.bin")]


def test_large_blobs_are_not_read(make_pkg):
    """An LFS pointer is under 1 KiB: a larger blob is skipped on its header."""
    pkg = make_pkg(P16)
    (pkg / "model.bin").write_bytes(os.urandom(64 * 1024))
    commit_all(pkg)
    blob = bytes.fromhex(git(pkg, "rev-parse", ":model.bin").strip())
    with gitread.Repo(pkg) as repo:
        assert repo.small_blob(blob, 1024) is None
        assert len(repo.small_blob(blob, 1 << 20)) == 64 * 1024
    git(pkg, "gc", "-q")
    with gitread.Repo(pkg) as repo:
        assert repo.small_blob(blob, 1024) is None


@pytest.mark.parametrize("alternates", [False, True], ids=["partial-clone", "alternates"])
def test_a_missing_object_is_a_warning_not_a_traceback(make_pkg, tmp_path, capsys, alternates):
    """A partial clone lacks blobs; `git cat-file` answered "missing" and
    raipack raised IndexError. Objects behind objects/info/alternates (another
    repository, outside the package) are not read either."""
    pkg = make_pkg(P16)
    lfs_clone(pkg)
    blob = git(pkg, "rev-parse", ":model.bin").strip()
    if alternates:
        other = tmp_path / "other.git"
        git(tmp_path, "clone", "-q", "--bare", str(pkg), str(other))
        (pkg / ".git" / "objects" / "info" / "alternates").write_text(f"{other / 'objects'}\n")
    (pkg / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    with pytest.raises(SystemExit) as info:
        main(["validate", str(pkg), "--verify-hashes"])
    out, err = capsys.readouterr()
    assert info.value.code == 0 and "Traceback" not in err
    hits = rp802(validate(pkg, verify_hashes=True))
    assert [(s, p) for s, p, _ in hits if s != "info"] == [("warning", "model.bin")]
    assert blob in hits[0][2] and "lacks it" in out and ("alternates" in hits[0][2]) == alternates


@pytest.mark.parametrize("damage", ["truncated", "flipped", "garbage", "fifo", "link-outside"])
def test_a_damaged_index_is_a_warning_not_a_traceback(make_pkg, tmp_path, damage, capsys):
    pkg = make_pkg(P16)
    lfs_clone(pkg)
    index = pkg / ".git" / "index"
    data = index.read_bytes()
    index.unlink()
    if damage == "truncated":
        index.write_bytes(data[: len(data) // 2])
    elif damage == "flipped":
        index.write_bytes(data[:40] + bytes([data[40] ^ 1]) + data[41:])
    elif damage == "garbage":
        index.write_bytes(b"DIRC\0\0\0\x02\xff\xff\xff\xff" + bytes(40))
    elif damage == "fifo":
        os.mkfifo(index)
    else:
        (tmp_path / "outside").write_bytes(data)
        index.symlink_to(tmp_path / "outside")
    with pytest.raises(SystemExit) as info:
        main(["validate", str(pkg), "--verify-hashes"])
    _, err = capsys.readouterr()
    assert info.value.code == 0 and "Traceback" not in err
    hits = [(s, p) for s, p, _ in rp802(validate(pkg, verify_hashes=True))]
    assert ("warning", ".git") in hits


def test_a_git_file_pointing_elsewhere_is_not_followed(make_pkg, tmp_path):
    """A `.git` file (worktree, submodule) names a repository outside the
    package: raipack says so and reads nothing there."""
    elsewhere = make_pkg(P16)
    lfs_clone(elsewhere)
    pkg = make_pkg(P16)
    (pkg / ".git").write_text(f"gitdir: {elsewhere / '.git'}\n")
    hits = rp802(validate(pkg, verify_hashes=True))
    assert ("info", ".git") in [(s, p) for s, p, _ in hits]
    (pkg / ".git").unlink()
    (pkg / ".git").symlink_to(elsewhere / ".git")
    assert ("info", ".git") in [(s, p) for s, p, _ in rp802(validate(pkg, verify_hashes=True))]
    assert oids(pkg)[0] == {}


def test_damaged_index_and_packs_never_raise_anything_but_a_git_read_error(make_pkg):
    """Seeded byte mutations of a real index (checksum recomputed, so the
    parser itself is reached) and of a pack and its index."""
    pkg = make_pkg(P16)
    lfs_clone(pkg, history=True)
    git(pkg, "update-index", "--index-version", "4")
    git(pkg, "gc", "-q")
    git_dir = pkg / ".git"
    blob = bytes.fromhex(git(pkg, "rev-parse", ":model.bin").strip())
    pack_files = sorted((git_dir / "objects" / "pack").glob("pack-*.*"))
    originals = {p: p.read_bytes() for p in [git_dir / "index", *pack_files]}
    with gitread.Repo(pkg) as repo:
        at = repo.packs()[0].find(blob)  # the pointer's delta; its base is stored before it
    span = {p: range(len(originals[p])) for p in originals}
    span[next(p for p in pack_files if p.suffix == ".pack")] = range(max(12, at - 200), at + 40)
    for p in originals:
        p.chmod(stat.S_IRUSR | stat.S_IWUSR)
    rng = random.Random(11)
    for _ in range(200):
        target = rng.choice(list(originals))
        data = bytearray(originals[target])
        for _ in range(rng.randint(1, 4)):
            data[rng.choice(span[target])] = rng.randrange(256)
        if target.name == "index" and rng.random() < 0.8:
            data[-20:] = hashlib.sha1(bytes(data[:-20])).digest()
        target.write_bytes(bytes(data))
        try:
            with gitread.Repo(pkg) as repo:
                repo.index()
                repo.small_blob(blob, 1024)
        except gitread.GitReadError:
            pass
        target.write_bytes(originals[target])


def test_duplicate_paths_in_the_manifest_name_both_entries(make_pkg):
    pkg = make_pkg("reference-4K")
    assert validate(pkg).findings == []
    edit_json(pkg / "manifest.json", lambda d: d["files"].append(dict(d["files"][2])))
    doc_files = json.loads((pkg / "manifest.json").read_text())["files"]
    rel, last = doc_files[2]["path"], len(doc_files) - 1
    hits = [f for f in validate(pkg).findings if f.check_id == "RP801" and f.severity == "error"]
    assert [(f.path, f.pointer) for f in hits] == [(rel, f"/files/{last}")]
    assert "/files/2" in hits[0].message and f"/files/{last}" in hits[0].message


def test_manifest_pointers_count_every_entry(make_pkg):
    """Pointers name an entry's index in `files`, also after an entry that has no path."""
    pkg = make_pkg("reference-4K")
    edit_json(pkg / "manifest.json", lambda d: d["files"].insert(0, {"size": 1}))
    (pkg / "README.md").write_text("changed\n")
    doc_files = json.loads((pkg / "manifest.json").read_text())["files"]
    i = next(i for i, e in enumerate(doc_files) if e.get("path") == "README.md")
    hits = [f for f in validate(pkg).findings if f.check_id == "RP801" and f.path == "README.md"]
    assert [f.pointer for f in hits] == [f"/files/{i}/size"]
