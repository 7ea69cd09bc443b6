"""Hub-ready packages: the `.gitattributes` raipack writes, RP110 and `validate --for hub`, and
`raipack publish`'s plan and refusals. Large files are sparse (no disk); nothing is uploaded: the
one upload test replaces huggingface_hub's client with a recorder."""

from __future__ import annotations

import json
import sys
import types

import pytest

import fake_stages
from helpers import run_cli
from raipack.builder.recipe import load
from raipack.builder.runner import build
from raipack.core import lfs, manifest
from raipack.core.gitattributes import Attributes

MiB = 2**20


@pytest.fixture
def big_pkg(make_pkg):
    """A 1.8.0 NPU package with the example's sizes (model.bin 64 MiB, model.onnx.data 113 MiB), sparse."""
    return make_pkg("1.8.0-npu-16K", sparse=True, npu_bytes=64 * MiB, data_bytes=113 * MiB)


def test_rendered_rules_cover_amd_kinds_and_every_large_file():
    sizes = {"model.bin": 64 * MiB, "model.onnx.data": 113 * MiB, "model.pb.bin": 300, "cache/x.const": 20 * MiB,
             "dd_metastate_Llm_Token_MatMulNBits_0_0.fconst": 5, "tokenizer.json": 11 * MiB, "notes/big file.txt": 12 * MiB,
             "config.json": 900, "README.md": 4000}
    attrs = Attributes({lfs.NAME: lfs.render(sizes)})
    over = [rel for rel, size in sizes.items() if size > lfs.limit()]
    assert all(attrs.in_lfs(rel) for rel in over + ["model.pb.bin", "dd_metastate_Llm_Token_MatMulNBits_0_0.fconst"])
    assert not attrs.in_lfs("config.json") and not attrs.in_lfs("README.md")  # small text stays in git, diffable
    assert '"notes/big file.txt" filter=lfs' in lfs.render(sizes)  # a path with a space is quoted for git


def test_built_package_carries_gitattributes_listed_in_its_manifest(tmp_path, monkeypatch):
    fake_stages.use_in_test(tmp_path, monkeypatch)
    pkg = build(load(None, {"output": "build"})).package
    attrs = Attributes({lfs.NAME: (pkg / lfs.NAME).read_text()})
    assert attrs.in_lfs("model.bin") and attrs.in_lfs("model.onnx.data") and attrs.in_lfs("model.pb.bin")
    listed = {f["path"] for f in manifest.read(pkg)["files"]}
    assert lfs.NAME in listed


def test_validate_for_hub_fails_naming_the_uncovered_files(big_pkg, capsys):
    lfs.write(big_pkg)
    code, out, _ = run_cli(capsys, "validate", big_pkg, "--for", "hub", "--format", "json")
    assert code == 0, out
    (big_pkg / lfs.NAME).unlink()
    code, out, _ = run_cli(capsys, "validate", big_pkg, "--format", "json")
    findings = [f for f in json.loads(out)["results"][0]["findings"] if f["check_id"] == "RP110"]
    assert code == 0 and {f["severity"] for f in findings} == {"warning"}  # a warning without --for hub
    code, out, _ = run_cli(capsys, "validate", big_pkg, "--for", "hub")
    assert code == 1
    assert "model.bin" in out and "model.onnx.data" in out and "*.onnx.data filter=lfs diff=lfs merge=lfs -text" in out


def test_a_rule_that_unsets_lfs_is_named(big_pkg, capsys):
    lfs.write(big_pkg)
    with open(big_pkg / lfs.NAME, "a") as fh:
        fh.write("model.bin -filter\n")
    code, out, _ = run_cli(capsys, "validate", big_pkg, "--for", "hub")
    assert code == 1 and "model.bin" in out and "(model.bin) keeps it out" in out and "model.onnx.data" not in out


def test_a_binary_file_over_1_mb_outside_lfs_is_refused_a_text_one_is_not(big_pkg, capsys):
    lfs.write(big_pkg)
    (big_pkg / "notes.txt").write_text("plain text line\n" * 80_000)  # 1.3 MB of text: git, diffable
    (big_pkg / "blob.raw").write_bytes(b"\x00\x01" * 600_000)  # 1.2 MB with NUL bytes: binary
    code, out, _ = run_cli(capsys, "validate", big_pkg, "--for", "hub")
    assert code == 1 and "blob.raw" in out and "binary file over the Hub's 1 MB limit" in out and "notes.txt" not in out


def test_an_oversized_attributes_file_is_named_not_read(big_pkg, capsys):
    (big_pkg / lfs.NAME).write_text("*.bin filter=lfs\n" + "# padding\n" * 120_000)  # 1.2 MB
    code, out, _ = run_cli(capsys, "validate", big_pkg, "--for", "hub")
    assert code == 1 and ".gitattributes" in out and "its rules were not read" in out


def test_publish_dry_run_plan_and_refusal(big_pkg, capsys):
    lfs.write(big_pkg)
    code, out, _ = run_cli(capsys, "publish", big_pkg, "--dry-run", "--repo", "me/pkg")
    assert code == 0, out
    assert "64.0 MiB  LFS      model.bin" in out and "The Hub would take every file." in out
    with open(big_pkg / "extra.dat", "wb") as fh:
        fh.truncate(11 * MiB)
    code, out, _ = run_cli(capsys, "publish", big_pkg, "--dry-run", "--json")
    plan = json.loads(out)
    assert code == 1 and plan["refused"]
    assert [r["path"] for r in plan["refusals"]] == ["extra.dat"]
    assert plan["refusals"][0]["hint"].endswith("extra.dat filter=lfs diff=lfs merge=lfs -text")


def test_publish_shows_the_card_metadata(big_pkg, capsys):
    lfs.write(big_pkg)
    (big_pkg / "README.md").write_text("---\nlicense: apache-2.0\ntags:\n- ryzenai\n---\n# card\n")
    code, out, _ = run_cli(capsys, "publish", big_pkg, "--dry-run")
    assert code == 0 and "license: apache-2.0" in out and "tags: ['ryzenai']" in out


def _recording_hub(monkeypatch, token="t0ken"):
    calls = []

    class Api:
        def __init__(self, token):
            calls.append(("token", token))

        def create_repo(self, repo_id, **kw):
            calls.append(("create_repo", repo_id, kw))

        def upload_folder(self, **kw):
            calls.append(("upload_folder", kw))
            return types.SimpleNamespace(commit_url=f"hub://{kw['repo_id']}/commit/1")

    fake = types.SimpleNamespace(HfApi=Api, get_token=lambda: token)
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return calls


def test_a_refused_upload_sends_nothing(big_pkg, capsys, monkeypatch):
    calls = _recording_hub(monkeypatch)
    with open(big_pkg / "extra.dat", "wb") as fh:
        fh.truncate(11 * MiB)
    lfs.write(big_pkg)  # covers extra.dat by its path ...
    (big_pkg / lfs.NAME).write_text((big_pkg / lfs.NAME).read_text().replace("extra.dat filter=lfs", "extra.dat -filter"))  # ... and unset again
    code, out, _ = run_cli(capsys, "publish", big_pkg, "--repo", "me/pkg")
    assert code == 1 and "REFUSED" in out and "nothing was uploaded" in out
    assert calls == []


def test_upload_needs_a_token_and_a_repo(big_pkg, capsys, monkeypatch):
    lfs.write(big_pkg)
    calls = _recording_hub(monkeypatch, token=None)
    code, _, err = run_cli(capsys, "publish", big_pkg, "--repo", "me/pkg")
    assert code == 2 and "HF_TOKEN is not set" in err and calls == []
    code, _, err = run_cli(capsys, "publish", big_pkg)
    assert code == 2 and "--repo OWNER/NAME" in err
    code, _, err = run_cli(capsys, "publish", big_pkg, "--repo", "not a repo id", "--dry-run")
    assert code == 2 and "OWNER/NAME" in err


def test_upload_goes_through_huggingface_hub_with_the_plan(big_pkg, capsys, monkeypatch):
    lfs.write(big_pkg)
    calls = _recording_hub(monkeypatch)
    code, out, _ = run_cli(capsys, "publish", big_pkg, "--repo", "me/pkg", "--private")
    assert code == 0, out
    assert calls[0] == ("token", "t0ken") and calls[1] == ("create_repo", "me/pkg", {"repo_type": "model", "private": True, "exist_ok": True})
    assert calls[2][1]["folder_path"] == str(big_pkg) and ".git/**" in calls[2][1]["ignore_patterns"]
    assert "uploaded: hub://me/pkg/commit/1" in out


def test_plan_refuses_a_file_over_the_per_file_limit_even_in_lfs():
    attrs = Attributes({lfs.NAME: lfs.render({})})
    [small, huge] = lfs.plan({"a.bin": 20 * 2**30, "b.bin": 51 * 2**30}, attrs)
    assert small.lfs and not small.refused
    assert huge.lfs and "50 GiB limit per file" in huge.refused
