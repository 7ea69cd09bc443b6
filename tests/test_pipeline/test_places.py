"""Packages where they live (issue 38): a Hugging Face cache filled by a real snapshot_download, and a Hub
repository read through huggingface_hub, both from the Hub stand-in of tests/hub_server.py on 127.0.0.1."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from factory import make_package
from helpers import edit_json
from hub_server import FakeHub, Repo, env_for, served_repo, snapshot_download
from raipack.places import hfcache, hub
from raipack.validate import validate
from real_corpus import rebuild

PROFILE = "1.8.0-npu-16K"
ORG = "amd"


def _raipack(env: dict, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raipack.cli", "validate", *args], env=env, capture_output=True, text=True, timeout=300)


def _json(done: subprocess.CompletedProcess) -> list[dict]:
    assert done.stdout.startswith("{"), (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    return json.loads(done.stdout)["results"]


def _findings(result) -> list[tuple]:
    return sorted((f.check_id, f.severity, f.path, f.message) for f in result.findings)


def _faulty(root: Path) -> Path:
    """A 1.8 NPU 16K package with faults raipack finds in its configs: a search.max_length beyond the model's
    context, heads that config.json contradicts, no rai_config.json."""
    pkg = make_package(root, PROFILE)
    edit_json(pkg / "genai_config.json", lambda d: d["search"].update(max_length=10**7))
    edit_json(pkg / "config.json", lambda d: d.update(num_attention_heads=7))
    (pkg / "rai_config.json").unlink()
    return pkg


# ------------------------------------------------------------------------------ the cache


@pytest.fixture
def cache(tmp_path):
    """A Hugging Face cache filled by huggingface_hub's own snapshot_download from the stand-in: a faulty
    1.8 package and a clean one; (cache root, {repo_id: the plain folder served})."""
    served = {}
    with FakeHub() as fake:
        for pkg in (_faulty(tmp_path / "src-a"), make_package(tmp_path / "src-b", "1.8.0-npu-4K")):
            repo_id = f"{ORG}/{pkg.name}"
            fake.repos[repo_id] = Repo.from_folder(pkg)
            served[repo_id] = pkg
        env = env_for(tmp_path, fake, HF_HUB_CACHE=str(tmp_path / "hub-cache"))
        snaps = {repo_id: snapshot_download(env, repo_id) for repo_id in served}
    return tmp_path / "hub-cache", served, snaps


def test_a_cached_snapshot_validates_as_the_same_files_in_a_plain_folder(cache, tmp_path):
    root, served, snaps = cache
    repo_id = next(r for r in served if "16K" in r)
    snap = snaps[repo_id]
    assert all(p.is_symlink() for p in snap.iterdir() if p.is_file()), "huggingface_hub wrote no links into blobs/"
    plain = validate(served[repo_id])
    cached = validate(snap)
    assert _findings(cached) == _findings(plain) and cached.findings, "the cached package judged unlike its plain copy"
    assert cached.checks_run == plain.checks_run
    assert cached.profile == PROFILE and f"the repository name {repo_id!r} names Ryzen AI 1.8.0" in cached.profile_reason  # not the commit hash
    # the same files in a folder named by the revision hash, as the snapshot is, say nothing of the release
    copy = tmp_path / "copy" / snap.name
    shutil.copytree(snap, copy)  # follows the links: plain files
    assert repr(repo_id) not in validate(copy).profile_reason


def test_the_repository_folder_and_the_cache_root_stand_for_their_snapshots(cache, tmp_path):
    root, served, snaps = cache
    repo_dir = root / ("models--" + next(iter(served)).replace("/", "--"))
    assert hfcache.snapshots(repo_dir) == [snaps[next(iter(served))]]
    assert sorted(hfcache.snapshots(root)) == sorted(snaps.values())
    results = _json(_raipack(env_for(tmp_path, HF_HUB_CACHE=str(root)), "--hf-cache", "--format", "json", "--jobs", "2"))
    assert sorted(r["root"] for r in results) == sorted(str(s) for s in snaps.values())
    assert {r["profile"] for r in results} == {PROFILE, "1.8.0-npu-4K"}
    done = _raipack(env_for(tmp_path), str(repo_dir), "--revision", "0" * 40)
    assert done.returncode == 2 and "has no snapshot of revision" in done.stderr and "Traceback" not in done.stderr


def test_a_link_leaving_the_cache_is_still_refused(cache, tmp_path):
    root, served, snaps = cache
    snap = snaps[next(r for r in served if "4K" in r)]
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    (snap / "extra.json").symlink_to(outside)
    found = [f for f in validate(snap).findings if f.path == "extra.json"]
    assert found and found[0].severity == "error" and "leaves the package" in found[0].message


def test_verify_hashes_holds_cached_blobs_to_the_hubs_lfs_sha256(cache):
    root, served, snaps = cache
    snap = snaps[next(r for r in served if "4K" in r)]
    clean = validate(snap, verify_hashes=True)
    assert "RP802" in clean.checks_run and not [f for f in clean.findings if f.check_id == "RP802"]
    blob = Path(os.path.realpath(snap / "model.onnx.data"))  # an LFS file: its blob is named by its sha256
    assert len(blob.name) == 64
    data = bytearray(blob.read_bytes())
    data[100] ^= 0xFF
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))
    found = [f for f in validate(snap, verify_hashes=True).findings if f.check_id == "RP802"]
    assert [(f.severity, f.path) for f in found] == [("error", "model.onnx.data")] and "the Hub's LFS record" in found[0].message


# ------------------------------------------------------------------------------ the Hub


def test_hub_repository_judged_from_its_listing_without_the_large_files(tmp_path):
    pkg = make_package(tmp_path / "src", PROFILE)
    runs = []
    with FakeHub() as fake:
        fake.repos[f"{ORG}/{pkg.name}"] = served_repo(pkg, {"model.bin": 8 << 30})  # the tree lists an 8 GB model.bin
        for attempt in range(3):  # the best of three: the machine is shared, a run can wait for a core
            fake.served, fake.requests = 0, []
            start = time.perf_counter()
            done = _raipack(env_for(tmp_path / str(attempt), fake), f"hf://{ORG}/{pkg.name}", "--format", "json")
            runs.append((_json(done)[0], time.perf_counter() - start, fake.served, list(fake.requests), done))
            if runs[-1][0]["seconds"] < 2:
                break
    result, wall, served, requests, done = min(runs, key=lambda r: r[0]["seconds"])
    print(f"hf:// judged in {result['seconds']:.2f} s ({wall:.2f} s with the process start), {served} bytes downloaded, {len(requests)} requests")
    assert done.returncode == 0, done.stdout
    assert result["seconds"] < 2 and all(r[2] < 1_000_000 for r in runs)
    assert not any("model.bin" in r and "pb.bin" not in r for r in requests if r.startswith("GET")), "the 8 GB file was asked for"
    assert result["root"].startswith(f"hf://{ORG}/{pkg.name}@") and result["profile"] == PROFILE
    skipped = [f for f in result["findings"] if f["message"].startswith("skipped: ")]
    assert skipped and all(f["severity"] == "info" and f["check_id"] not in result["checks_run"] for f in skipped)
    assert all("does not download" in f["message"] for f in skipped)


@pytest.mark.parametrize("fault", ["configs", "weights size"])
def test_hub_repository_finds_the_faults_a_local_copy_has(tmp_path, fault):
    if fault == "configs":
        pkg, big = _faulty(tmp_path / "src"), {}
    else:  # the header names 4096 bytes of weights; the Hub lists model.bin short of them
        pkg, big = make_package(tmp_path / "src", PROFILE), {"model.bin": 1000}
        with open(pkg / "model.bin", "r+b") as fh:
            fh.truncate(1000)
    local = validate(pkg)
    with FakeHub() as fake:
        fake.repos[f"{ORG}/{pkg.name}"] = served_repo(pkg, big)
        [remote] = _json(_raipack(env_for(tmp_path, fake), f"hf://{ORG}/{pkg.name}", "--format", "json"))
    ran = set(remote["checks_run"])
    expected = sorted((f.check_id, f.severity, f.path, f.message) for f in local.findings if f.check_id in ran)
    got = sorted((f["check_id"], f["severity"], f["path"], f["message"]) for f in remote["findings"] if not f["message"].startswith("skipped: "))
    assert expected and got == expected
    assert any(f[1] == "error" for f in got)


def test_a_real_amd_package_on_the_hub_is_judged_as_its_local_copy(tmp_path):
    pkg = rebuild("Qwen-2.5-1.5B-Instruct-onnx-ryzenai-npu", tmp_path / "src")
    local = validate(pkg)
    with FakeHub() as fake:
        fake.repos[f"{ORG}/{pkg.name}"] = served_repo(pkg)
        done = _raipack(env_for(tmp_path, fake), f"hf://{ORG}/{pkg.name}", "--format", "json")
        served = fake.served
    [remote] = _json(done)
    assert remote["profile"] == local.profile and served <= 1_000_000
    ran = set(remote["checks_run"])
    expected = sorted((f.check_id, f.severity, f.path) for f in local.findings if f.check_id in ran)
    assert sorted((f["check_id"], f["severity"], f["path"]) for f in remote["findings"] if not f["message"].startswith("skipped: ")) == expected


@pytest.mark.parametrize(("refusal", "code", "words"), [
    (None, 4, "does not exist on the Hub"),
    (401, 4, "was not found or is private"),
    (403, 4, "is gated"),
    (429, 5, "rate limit"),
])
def test_the_hubs_refusals_are_sentences_with_their_exit_codes(tmp_path, refusal, code, words):
    with FakeHub() as fake:
        if refusal:
            fake.repos[f"{ORG}/pkg"] = Repo({"genai_config.json": b"{}"}, refusal=refusal)
        done = _raipack(env_for(tmp_path, fake), f"hf://{ORG}/pkg")
    assert done.returncode == code, done.stderr
    assert words in done.stderr and "Traceback" not in done.stderr and done.stderr.startswith("ERROR: ")
    assert len(done.stderr.splitlines()[0].split(". ")) == 1  # one sentence


def test_no_network_and_a_missing_revision(tmp_path):
    with FakeHub() as fake:
        fake.repos[f"{ORG}/pkg"] = Repo({"genai_config.json": b"{}"})
        missing = _raipack(env_for(tmp_path, fake), f"hf://{ORG}/pkg@v9")
        port = fake.api.server_address[1]
    closed = _raipack(env_for(tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{port}"), f"hf://{ORG}/pkg")  # the server is gone
    assert missing.returncode == 4 and "has no revision 'v9'" in missing.stderr
    assert closed.returncode == 5 and "cannot be reached" in closed.stderr and "Traceback" not in closed.stderr
    bad = _raipack(env_for(tmp_path), "hf://not a repo")
    assert bad.returncode == 2 and "is not a Hub repository name" in bad.stderr


def test_the_download_plan_keeps_to_its_budget():
    files = {"genai_config.json": 2000, "config.json": 900_000, "tokenizer.json": 11_000_000, "model.bin": 8 << 30,
             "model.pb.bin": 7000, "model.onnx": 300_000, "cache/a_meta.json": 500}
    chosen = hub.plan(files)
    assert chosen[:2] == ["genai_config.json", "config.json"]  # the configs first
    assert "model.bin" not in chosen and "tokenizer.json" not in chosen
    assert sum(files[r] for r in chosen) <= 1_000_000 and "model.pb.bin" in chosen and "model.onnx" not in chosen
