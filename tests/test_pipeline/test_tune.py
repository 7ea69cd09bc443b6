"""`raipack tune` rewrites genai_config.json consistently, atomically, or not at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import edit_json, ryzen
from raipack.cli import main
from raipack.core.errors import RaipackError
from raipack.tune import apply, plan
from raipack.validate import validate

P16, P4, P16_OLD = "1.8.0-npu-16K", "1.8.0-npu-4K", "1.7.1-npu-16K"
GENAI = "genai_config.json"
ROOT = Path(__file__).resolve().parents[2]


def run(capsys, *argv) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["tune", *map(str, argv)])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def snapshot(pkg: Path) -> dict[str, bytes]:
    return {p.relative_to(pkg).as_posix(): p.read_bytes() for p in sorted(pkg.rglob("*")) if p.is_file()}


def genai(pkg: Path) -> dict:
    return json.loads((pkg / GENAI).read_text())


def test_tune_16k_rewrites_only_genai_config(make_pkg, capsys):
    pkg = make_pkg(P16)

    def add_unknown(doc):
        doc["x_vendor"] = "keep me"  # unknown scalars at the top, which onnxruntime-genai ignores (an unknown key in search it refuses: RP204)
        doc["x_vendor_flag"] = False
        doc["x_vendor_ratio"] = 2.5
        ryzen(doc)["hybrid_opt_free_after_prefill"] = "1"
    edit_json(pkg / GENAI, add_unknown)
    before = snapshot(pkg)
    old_doc = genai(pkg)

    code, out, err = run(capsys, pkg, "--max-length", 8192, "--chunk-size", 2048)
    assert (code, err) == (0, "")
    assert "search.max_length: 16384 -> 8192" in out and "hybrid_opt_max_seq_length: 4096 -> 2048" in out
    assert "+    \"max_length\": 8192," in out and "ok:" in out  # the diff, then the re-validation
    after = snapshot(pkg)
    backups = [rel for rel in after if rel.startswith(GENAI + ".") and rel.endswith(".bak")]
    assert len(backups) == 1 and after[backups[0]] == before[GENAI]
    assert {rel for rel in after if after[rel] != before.get(rel)} == {GENAI, backups[0]}
    doc = genai(pkg)
    assert (doc["search"]["max_length"], doc["search"]["chunk_size"], ryzen(doc)["hybrid_opt_max_seq_length"]) == (8192, 2048, "2048")
    # everything not edited keeps its meaning
    for d in (doc, old_doc):
        d["search"].pop("max_length"), d["search"].pop("chunk_size"), ryzen(d).pop("hybrid_opt_max_seq_length")
    assert doc == old_doc
    assert [f for f in validate(pkg).findings if f.severity != "advice"] == []


def test_tune_4k_adds_a_chunk_size_and_keeps_indent(make_pkg, capsys):
    pkg = make_pkg(P4)
    text = json.dumps(genai(pkg), indent=4) + "\n"
    (pkg / GENAI).write_text(text)
    code, out, _ = run(capsys, pkg, "--chunk-size", 2048)
    assert code == 0
    new = (pkg / GENAI).read_text()
    assert new.endswith("}\n") and '\n        "search"' not in new and '\n    "search": {' in new
    changed = [line for line in out.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert len(changed) == 5  # seq length -/+, top_p gains a comma -/+, chunk_size +
    assert genai(pkg)["search"]["chunk_size"] == 2048 and ryzen(genai(pkg))["hybrid_opt_max_seq_length"] == "2048"


def test_tune_sets_the_kv_buffer_where_present(make_pkg, capsys):
    pkg = make_pkg(P16_OLD)
    edit_json(pkg / GENAI, lambda d: ryzen(d).update(max_length_for_kv_cache="16384"))
    code, _, _ = run(capsys, pkg, "--max-length", 8192)
    assert code == 0
    assert ryzen(genai(pkg))["max_length_for_kv_cache"] == "8192"


def test_dry_run_writes_nothing(make_pkg, capsys):
    pkg = make_pkg(P16)
    before = snapshot(pkg)
    code, out, _ = run(capsys, pkg, "--max-length", 8192, "--dry-run")
    assert code == 0 and "-    \"max_length\": 16384," in out and "dry run: nothing written" in out
    assert snapshot(pkg) == before


REFUSED = [
    (P16, ["--max-length", 32768], "--max-length 32768 is above 16384, the largest token tier"),
    (P4, ["--max-length", 8192], "--max-length 8192 is above 4096"),
    (P4, ["--max-length", 2048], "below rai_config.json's max_prompt_length 4096"),
    (P16, ["--chunk-size", 3000], "--chunk-size 3000 is not a prefill tier"),
    (P16, ["--max-prompt", 8192], "--max-prompt 8192 is above the 4096 tokens Ryzen AI 1.8.0 allows"),
    (P4, ["--max-prompt", 4096, "--sdk-version", "1.5.1"], "above the 2048 tokens Ryzen AI 1.5.1 allows"),
    ("reference-16K", ["--max-length", 8192], "token tier 8192 of node decoder has no metastate set"),  # a raipack package is compiled for its max_length
]


@pytest.mark.parametrize("profile_id,args,words", REFUSED, ids=[f"{p}-{a[0]}-{a[1]}" for p, a, _ in REFUSED])
def test_refused_values_leave_the_package_untouched(make_pkg, capsys, profile_id, args, words):
    pkg = make_pkg(profile_id)
    before = snapshot(pkg)
    code, out, err = run(capsys, pkg, *args)
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("ERROR: ") and words in lines[0] and lines[1].startswith("  hint: ")
    assert snapshot(pkg) == before


@pytest.mark.parametrize("args,words", [([], "needs at least one of"), (["--max-prompt", 100, "--sdk-version", "9.9"], "--sdk-version 9.9"), (["--max-length", 0], "--max-length")])
def test_usage_errors_exit_2(make_pkg, capsys, args, words):
    pkg = make_pkg(P16)
    before = snapshot(pkg)
    code, _, err = run(capsys, pkg, *args)
    assert code == 2 and words in err and "Traceback" not in err
    assert snapshot(pkg) == before


def test_a_failed_write_keeps_the_original(make_pkg, capsys, monkeypatch):
    pkg = make_pkg(P16)
    original = (pkg / GENAI).read_bytes()
    real_fsync, calls = os.fsync, []

    def failing_fsync(fd):
        calls.append(fd)
        if len(calls) == 2:  # the backup is written first; the new genai_config.json second
            raise OSError(28, "No space left on device")
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", failing_fsync)
    code, _, err = run(capsys, pkg, "--max-length", 8192)
    assert code == 1 and "No space left on device" in err.splitlines()[0]
    assert (pkg / GENAI).read_bytes() == original
    assert [p.name for p in pkg.iterdir() if p.name.endswith(".tmp")] == []


KILL_MID_WRITE = """
import os, signal, sys
real_replace = os.replace
def replace(src, dst):
    if str(dst).endswith("genai_config.json"):
        os.kill(os.getpid(), signal.SIGKILL)  # killed after the temp file is written, before the rename
    real_replace(src, dst)
os.replace = replace
from raipack.cli import main
main(["tune", sys.argv[1], "--max-length", "8192"])
"""


def test_a_killed_write_keeps_the_original(make_pkg, capsys):
    pkg = make_pkg(P16)
    original = (pkg / GENAI).read_bytes()
    proc = subprocess.run([sys.executable, "-c", KILL_MID_WRITE, str(pkg)], cwd=ROOT, capture_output=True, timeout=120)
    assert proc.returncode == -9
    assert (pkg / GENAI).read_bytes() == original
    leftovers = [p.name for p in pkg.iterdir() if p.name.startswith(f".{GENAI}.")]
    assert leftovers and all(name.endswith(".tmp") for name in leftovers)  # hidden, and named as unfinished
    assert [f for f in validate(pkg).findings if f.severity == "error"] == []
    code, _, _ = run(capsys, pkg, "--max-length", 8192)  # a later run works
    assert code == 0 and genai(pkg)["search"]["max_length"] == 8192


# -- the file keeps what it was: mode, owner, symlink --------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o640])
def test_tune_keeps_the_file_mode_and_owner(make_pkg, capsys, mode):
    pkg = make_pkg(P16)
    (pkg / GENAI).chmod(mode)
    owner = (65534, 65534) if os.geteuid() == 0 else (os.getuid(), os.getgid())  # as root, prove another owner is kept too
    os.chown(pkg / GENAI, *owner)
    code, _, _ = run(capsys, pkg, "--max-length", 8192)
    assert code == 0 and genai(pkg)["search"]["max_length"] == 8192
    backup = next(pkg.glob(f"{GENAI}.*.bak"))
    for path in (pkg / GENAI, backup):
        st = path.stat()
        assert (oct(st.st_mode & 0o7777), (st.st_uid, st.st_gid)) == (oct(mode), owner), path.name


def test_tune_writes_through_an_in_package_symlink(make_pkg, capsys):
    pkg = make_pkg(P16)
    (pkg / "conf").mkdir()
    original = (pkg / GENAI).read_bytes()
    (pkg / GENAI).rename(pkg / "conf" / "settings.json")
    (pkg / GENAI).symlink_to("conf/settings.json")
    code, out, err = run(capsys, pkg, "--max-length", 8192)
    assert (code, err) == (0, ""), out
    assert (pkg / GENAI).is_symlink() and os.readlink(pkg / GENAI) == "conf/settings.json"
    assert json.loads((pkg / "conf" / "settings.json").read_text())["search"]["max_length"] == 8192
    assert next(pkg.glob(f"{GENAI}.*.bak")).read_bytes() == original
    assert [p.name for p in pkg.rglob("*.tmp")] == []


def test_a_symlink_repointed_outside_after_planning_is_not_written_through(make_pkg, tmp_path):
    pkg = make_pkg(P16)
    (pkg / GENAI).rename(pkg / "settings.json")
    (pkg / GENAI).symlink_to("settings.json")
    p = plan(pkg, 8192, None, None)
    outside = tmp_path / "outside.json"
    outside.write_bytes((pkg / "settings.json").read_bytes())
    (pkg / GENAI).unlink()
    (pkg / GENAI).symlink_to(outside)  # swapped between the plan and the write
    with pytest.raises(RaipackError, match="resolves outside the package .*; nothing was written"):
        apply(p)
    assert json.loads(outside.read_text())["search"]["max_length"] == 16384 and list(pkg.glob("*.bak")) == []


@pytest.mark.parametrize("kind", ["outside", "dev-zero", "fifo"])
def test_a_genai_config_that_is_no_package_file_is_refused_unopened(make_pkg, capsys, tmp_path, kind):
    pkg = make_pkg(P16)
    outside = tmp_path / "outside.json"
    outside.write_bytes((pkg / GENAI).read_bytes())
    (pkg / GENAI).unlink()
    if kind == "fifo":
        os.mkfifo(pkg / GENAI)  # opening it for reading would hang
    else:
        (pkg / GENAI).symlink_to(outside if kind == "outside" else "/dev/zero")
    before = {p.name: p.lstat().st_mtime_ns for p in pkg.iterdir()}
    code, out, err = run(capsys, pkg, "--max-length", 8192)
    lines = err.splitlines()
    assert code == 1 and out == "" and len(lines) == 2 and lines[1].startswith("  hint: ")
    assert f"{GENAI} is a symlink that leaves the package" in lines[0] if kind != "fifo" else "is not a regular file" in lines[0]
    assert {p.name: p.lstat().st_mtime_ns for p in pkg.iterdir()} == before
    assert json.loads(outside.read_text())["search"]["max_length"] == 16384


def test_round_trip_in_a_folder_without_rai_in_its_name(make_pkg, capsys):
    """search.max_length is what --profile auto tells a 16K package from a 4K one by, in a folder not
    named like AMD's: tune checks the edit against the profile detected before it, says how to keep it.
    (Content alone cannot tell 1.7.1 from 1.8.0 16K packages and takes the newest, 1.8.0.)"""
    pkg = make_pkg(P16, name="my-model")
    original = (pkg / GENAI).read_bytes()
    code, out, _ = run(capsys, pkg, "--max-length", 4096)
    assert code == 0
    assert f"profile {P16} (detected before the edit:" in out  # validated against the same profile, not re-detected
    assert f"pass --profile {P16} to later tune and validate runs" in out
    code, _, err = run(capsys, pkg, "--max-length", 16384)  # auto detection now sees a 4K package ...
    assert code == 1 and "above 4096" in err and "name that profile with --profile" in err
    code, out, _ = run(capsys, pkg, "--max-length", 16384, "--profile", P16)  # ... and the note's --profile undoes it
    assert code == 0 and (pkg / GENAI).read_bytes() == original
    assert [f for f in validate(pkg).findings if f.severity != "advice"] == []


# -- what is read is capped; bad input is one sentence -------------------------------

HUGE_GENAI = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # reading the file whole would need 2 GiB and more
from raipack.cli import main
main(["tune", sys.argv[1], "--max-length", "8192"])
"""


def test_a_2gb_genai_config_is_refused_before_it_is_read(make_pkg):
    pkg = make_pkg(P16)
    with open(pkg / GENAI, "r+b") as fh:
        fh.truncate(2 << 30)  # sparse: costs no disk
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", HUGE_GENAI, str(pkg)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and len(lines) == 2, proc.stderr[-2000:]
    assert time.monotonic() - start < 15  # a process start and a scan; reading 2 GiB is not in it
    assert f"{GENAI} is 2147483648 bytes, more than the 67108864 bytes" in lines[0] and lines[1].startswith("  hint: ")
    assert (pkg / GENAI).stat().st_size == 2 << 30 and list(pkg.glob("*.bak")) == []


def _deep(n: int) -> str:
    return "[" * n + "]" * n


BAD_INPUT = [
    (GENAI, lambda text: text.replace("{", '{"x_deep": ' + _deep(900) + ",", 1), f"{GENAI} is nested 901 levels deep"),
    (GENAI, lambda text: text.replace("{", '{"x_deep": ' + _deep(100_000) + ",", 1), f"{GENAI} is not usable JSON: nested too deeply"),
    (GENAI, lambda text: text.replace('"npu"', '"cpu", "hybrid_opt_token_backend": "npu"', 1), 'holds key "hybrid_opt_token_backend" 2 times in the object at /model/decoder/session_options/provider_options/0/RyzenAI'),
    ("rai_config.json", lambda _: '{"max_prompt_length": {"1.8.0": "4096"}}', 'max_prompt_length["1.8.0"] is "4096"; expected a whole number'),
    ("rai_config.json", lambda _: '{"max_prompt_length": {"1.8.0": "abc"}}', 'max_prompt_length["1.8.0"] is "abc"; expected a whole number'),
    ("rai_config.json", lambda _: '{"max_prompt_length": "abc"}', 'max_prompt_length is "abc"; expected an object'),
]


@pytest.mark.parametrize("rel,edit,words", BAD_INPUT, ids=["genai-900-deep", "genai-100000-deep", "genai-duplicate-key", "rai-string-number", "rai-string", "rai-not-object"])
def test_bad_input_is_one_sentence_and_exit_1(make_pkg, capsys, rel, edit, words):
    pkg = make_pkg(P16)
    (pkg / rel).write_text(edit((pkg / rel).read_text()))
    before = snapshot(pkg)
    code, out, err = run(capsys, pkg, "--max-length", 8192)
    lines = err.splitlines()
    assert code == 1 and out == "" and len(lines) == 2, err[-2000:]
    assert lines[0].startswith(f"ERROR: {pkg / rel}") and words in lines[0] and lines[1].startswith("  hint: ")
    assert snapshot(pkg) == before


def test_tuning_a_raipack_package_keeps_its_manifest_true(make_pkg, capsys):
    """A package raipack built lists genai_config.json in manifest.json: tune rewrites that entry (and lists
    the backup) so the tuned package validates clean, hashes included, and records what it changed."""
    pkg = make_pkg("reference-16K")
    code, out, err = run(capsys, pkg, "--chunk-size", 1024)
    assert (code, err) == (0, ""), out
    manifest = json.loads((pkg / "manifest.json").read_text())
    [record] = manifest["tuned"]
    assert record["file"] == GENAI and {"setting": "search.chunk_size", "old": 4096, "new": 1024} in record["changes"]
    entries = {e["path"]: e for e in manifest["files"]}
    assert entries[record["backup"]]["size"] == (pkg / record["backup"]).stat().st_size
    result = validate(pkg, verify_hashes=True)
    assert not result.findings, [f.message for f in result.findings]


def test_tune_refuses_a_genai_config_edited_after_the_build(make_pkg, capsys):
    pkg = make_pkg("reference-16K")
    (pkg / GENAI).write_text((pkg / GENAI).read_text() + " ")
    before = snapshot(pkg)
    code, out, err = run(capsys, pkg, "--chunk-size", 1024)
    assert code == 1 and out == "" and "does not match the sha256 manifest.json records" in err
    assert snapshot(pkg) == before


def test_a_raipack_package_tuned_to_smaller_chunks_runs_them(make_pkg, capsys):
    """RP906 takes the power of two holding a smaller chunk (what tune writes), and nothing else."""
    pkg = make_pkg("reference-16K")
    assert run(capsys, pkg, "--chunk-size", 512)[0] == 0
    assert ryzen(genai(pkg))["hybrid_opt_max_seq_length"] == "512"
    assert not validate(pkg).findings
    edit_json(pkg / GENAI, lambda doc: ryzen(doc).update(hybrid_opt_max_seq_length="2048"))
    found = [f for f in validate(pkg).findings if f.check_id == "RP906"]
    assert found and "or 512, the power of two holding the 512-token chunks" in found[0].message


def test_a_raipack_package_that_lost_its_manifest_is_still_taken_for_its_profile(make_pkg):
    """Auto detection reads raipack's own header when manifest.json is gone: the one finding is the missing
    manifest, under the reference profile, not dozens of 'unknown extension .plan' warnings of an AMD profile."""
    pkg = make_pkg("reference-16K")
    (pkg / "manifest.json").unlink()
    result = validate(pkg)
    assert result.profile == "reference-16K" and "fused for profile reference-16K" in result.profile_reason
    assert {f.check_id for f in result.findings} == {"RP107", "RP901"}
