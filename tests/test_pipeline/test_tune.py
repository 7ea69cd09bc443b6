"""`raipack tune` rewrites genai_config.json consistently, atomically, or not at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import edit_json, ryzen
from pipeline.cli import main
from pipeline.validate import validate

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
        doc["x_vendor"] = {"nested": [1, 2.5, None, "é"], "flag": False}
        doc["search"]["x_search_note"] = "keep me"
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
    ("reference-16K", ["--max-length", 8192], "manifest.json records the size and hash"),
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
from pipeline.cli import main
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
