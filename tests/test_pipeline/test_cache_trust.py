"""The cache trusts nothing an entry says about itself (issue 24, items 9 and 10): an entry rewritten
together with its own manifest.json is not a hit, with or without --verify-cache, because its manifest
is checked against the digest the key index recorded at commit; a source model edited in place with its
size and mtime kept is hashed again (the memo is keyed on inode and ctime too), and --verify-cache
rehashes the source. Fake stages: seconds."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from helpers import fake_build_env, fuse_entry, run_fake_build
from raipack.builder import cache
from raipack.core import manifest


@pytest.fixture
def env(tmp_path, monkeypatch):
    return fake_build_env(tmp_path, monkeypatch)


def swap_with_own_manifest(entry: Path) -> bytes:
    """Another node's rewrite: new bytes in model.onnx and a manifest that lists them, the stamp made to
    agree. Every check that reads only the entry finds it consistent."""
    for p in [entry, *entry.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    evil = b"swapped by another node" * 10
    (entry / "model.onnx").write_bytes(evil)
    doc = manifest.read(entry)
    for f in doc["files"]:
        if f["path"] == "model.onnx":
            f["sha256"], f["size"] = hashlib.sha256(evil).hexdigest(), len(evil)
    manifest.put(entry, doc)
    assert cache.changed_file(entry, manifest.read(entry)) is None  # consistent with itself
    cache._stamp_path(entry).write_text(json.dumps(cache.stamp(entry)))
    return evil


@pytest.mark.parametrize("verify", [False, True])
def test_an_entry_rewritten_with_its_own_manifest_is_not_a_hit(env, verify):
    run_fake_build()
    entry = fuse_entry()
    evil = swap_with_own_manifest(entry)
    statuses, printed = run_fake_build(verify_cache=verify)
    assert statuses["fuse"] == "built" and statuses["export"] == "cached"
    assert "cache: the fuse entry" in printed and "not the one the key index recorded at commit" in printed
    assert (fuse_entry() / "model.onnx").read_bytes() != evil
    assert cache.unrecorded(fuse_entry()) is None  # the rebuilt entry is recorded again


def test_an_entry_the_index_does_not_know_is_not_a_hit(env):
    run_fake_build()
    entry = fuse_entry()
    cache._index_path(entry).unlink()
    statuses, printed = run_fake_build()
    assert statuses["fuse"] == "built" and "the key index has no record of it" in printed


def test_the_index_record_lies_outside_the_entry_and_clear_removes_it(env):
    run_fake_build()
    entry = fuse_entry()
    record = cache._index_path(entry)
    assert not record.is_relative_to(entry)
    assert json.loads(record.read_text())["manifest_sha256"] == hashlib.sha256((entry / manifest.NAME).read_bytes()).hexdigest()
    cache.clear()
    assert not record.exists()


def edit_keeping_size_and_mtime(path: Path) -> None:
    """`cp -p` / `rsync -t` / `tar` of an edited copy: other bytes, the same size and mtime."""
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns


def test_a_source_edited_in_place_with_size_and_mtime_kept_gets_a_new_digest(env):
    model = env / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(b"\x01" * 4096)
    first = cache.folder_digest(model)
    edit_keeping_size_and_mtime(model / "model.safetensors")
    assert cache.folder_digest(model) != first


def test_verify_cache_rehashes_the_source_without_the_memo(env, monkeypatch):
    model = env / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"\x02" * 1024)
    true = cache.folder_digest(model)
    memo_path = cache.cache_root() / "digests.json"
    memo = json.loads(memo_path.read_text())
    memo = {tag: "0" * 64 for tag in memo}  # a memo that lies (a ctime that could not tell)
    memo_path.write_text(json.dumps(memo))
    assert cache.folder_digest(model) != true  # the memo is believed
    assert cache.folder_digest(model, memo=False) == true

    seen = []
    real = cache.folder_digest
    monkeypatch.setattr(cache, "folder_digest", lambda folder, memo=True: seen.append(memo) or real(folder, memo))
    run_fake_build(verify_cache=True)
    # each stage's cache key over its inputs (quantize, export, fuse, smoke: one input each) hashed without the memo;
    # the lineage's second digest of the same folder may use the memo the rehash just wrote
    assert seen.count(False) >= 4, seen
