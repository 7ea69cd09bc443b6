"""AMD's real packages (tests/data/real/), judged as docs/amd-packages.md says.

Each package's layout is rebuilt from its kept files and its recorded file list and validated;
the docs table is the expectation (profile, exit code, findings as `severity id file`), so the
table and raipack cannot drift apart. AMD's folder names are checked against what they stand for.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from raipack.core.package import Package
from raipack.npu.detect import detect
from raipack.validate import validate
from real_corpus import REAL, packages, provenance, rebuild

DOC = Path(__file__).resolve().parents[1] / "docs" / "amd-packages.md"
ROW = re.compile(r"^\| `([^`]+)` \|(.*)\|\s*$")


def doc_table() -> dict[str, dict]:
    """folder → {profile, exit, findings} from the first table of docs/amd-packages.md."""
    rows = {}
    for line in DOC.read_text().split("\n## ")[0].splitlines():
        m = ROW.match(line)
        if not m:
            continue
        cells = [c.strip() for c in m.group(2).split("|")]
        findings = {tuple(item.split()) for item in cells[-1].split(";") if item.strip() and item.strip() != "none"}
        rows[m.group(1)] = {"profile": cells[-3].strip("`"), "exit": int(cells[-2]), "findings": findings}
    return rows


def test_every_corpus_package_has_a_row_and_a_provenance():
    table = doc_table()
    assert sorted(table) == packages() and len(table) >= 3
    for name in packages():
        prov = provenance(name)
        src = prov["source"]
        assert src["repository"] and re.fullmatch(r"[0-9a-f]{40}", src["commit"]), name
        assert prov["files"] and all(isinstance(e["size"], int) for e in prov["files"].values())
        kept = {p.relative_to(REAL / name / "files").as_posix().removesuffix(".gz") for p in (REAL / name / "files").rglob("*") if p.is_file()}
        assert kept == {rel for rel, e in prov["files"].items() if e.get("kept", "").startswith("verbatim")}, name


def _publisher(source: dict) -> str:
    """Who a source's content comes from: a thread's author, else the repository's owner (two copies by one owner are one source)."""
    return source.get("author") or source["repository"].split("/")[0]


def test_the_corpus_comes_from_four_independent_public_sources():
    sources = [provenance(n)["source"] for n in packages()]
    sources += [provenance(n)["edit"] for n in packages() if "edit" in provenance(n)]
    sources += json.loads((REAL / "folder_names.json").read_text())["sources"].values()
    assert all(s.get("commit") or s.get("thread") for s in sources), "every source names a commit or a thread"
    publishers = {_publisher(s) for s in sources}
    assert len(publishers) >= 4, publishers


@pytest.mark.parametrize("name", packages())
def test_amd_package_is_judged_as_the_docs_table_says(tmp_path, name):
    expected = doc_table()[name]
    pkg = rebuild(name, tmp_path)
    for rel, entry in provenance(name)["files"].items():
        assert (pkg / rel).stat().st_size == entry["size"], rel  # every shipped file, at its real size
    result = validate(pkg)
    got = {(f.severity, f.check_id, f.path) for f in result.findings}
    assert result.profile == expected["profile"], result.profile_reason
    assert (1 if result.failed() else 0) == expected["exit"]
    assert got == expected["findings"], "docs/amd-packages.md lists other findings than raipack gives: " + repr(sorted(got))


def test_amd_16_npu_configuration_exits_0_with_a_warning_naming_the_4096_token_limit(tmp_path):
    result = validate(rebuild("Qwen-2.5-1.5B-Instruct-onnx-ryzenai-npu", tmp_path))
    assert not result.failed()
    [warning] = [f for f in result.findings if f.severity == "warning" and f.check_id != "RP110"]  # RP110: the Hub push, docs/amd-packages.md
    assert warning.check_id == "RP501" and "4096 tokens" in warning.message and "32768" in warning.message


def test_the_shipped_defects_stay_in_the_corpus(tmp_path):
    """A copy without tokenizer.json, a shipped onnx_utils.log, 0-byte metastate files: kept as shipped."""
    hybrid = rebuild("SmolLM2-135M-Instruct-onnx-ryzenai-1.7-hybrid", tmp_path / "a")
    assert not (hybrid / "tokenizer.json").exists()
    log = (hybrid / "onnx_utils.log").read_bytes()
    assert log.startswith(b"2026-01-13 22:21:35 [INFO] ryzenai_onnx_utils") and log.endswith(b"Saved final model\r\n")
    npu = rebuild("Qwen-2.5-1.5B-Instruct-onnx-ryzenai-npu", tmp_path / "b")
    assert (npu / "dd_metastate_Llm_Token_MatMulNBits_2_0.super").stat().st_size == 0
    assert len(list((npu / ".cache").glob("*.const"))) == 732


def _names():
    doc = json.loads((REAL / "folder_names.json").read_text())
    for entry in doc["names"]:
        suffix = next(s for s in doc["expectations"] if entry["folder"].endswith(s))
        yield pytest.param(entry["folder"], doc["expectations"][suffix], id=entry["folder"])


@pytest.mark.parametrize(("folder", "expect"), list(_names()))
def test_amd_folder_name_is_detected_as_what_it_stands_for(tmp_path, folder, expect):
    (tmp_path / folder).mkdir()
    found = detect(Package.scan(tmp_path / folder))
    assert found is not None, f"{folder}: no profile from the name"
    prof = found.profile
    assert prof.target == expect["target"] and any(prof.release.startswith(r) for r in expect["releases"]), prof.id
    if "context" in expect:
        assert prof.context == expect["context"], prof.id


def test_the_npu_copy_as_uploaded_without_its_cache_constants_is_one_finding_for_732_files(tmp_path):
    """The public copy lacks the .const files its meta names: one RP603 finding naming them compactly."""
    pkg = rebuild("Qwen-2.5-1.5B-Instruct-onnx-ryzenai-npu", tmp_path)
    for const in (pkg / ".cache").glob("*.const"):
        const.unlink()
    [found] = [f for f in validate(pkg, select=["RP603"]).findings]
    assert found.message.startswith(".cache\\MatMulNBits_2_0_{0..731}.const: 732 files") and len(found.members) == 732
