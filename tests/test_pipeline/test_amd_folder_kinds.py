"""Every kind of folder AMD ships for the NPU in 1.7-1.8 is judged as its loaders read it (issue 36).

Each folder is built from its public description (tests/data/described/amd_folders.json: who
described it, the edits to a factory package of its profile, the verdict raipack must give)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from raipack.cli import main
from raipack.validate import validate

DESCRIBED = json.loads((Path(__file__).resolve().parent.parent / "data" / "described" / "amd_folders.json").read_text())["folders"]
GENAI = "genai_config.json"


def _tiny_graph(path: Path) -> None:
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(g), path)


def _node(doc: dict, pointer: str) -> dict:
    for part in pointer.split("/"):
        doc = doc.setdefault(part, {})
    return doc


def _apply(pkg: Path, edits: dict) -> None:
    for old, new in edits.get("rename", {}).items():
        (pkg / old).rename(pkg / new)
    for old, new in edits.get("move", {}).items():
        (pkg / new).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(pkg / old, pkg / new)
    doc = json.loads((pkg / GENAI).read_text())
    for pointer, values in edits.get("genai", {}).items():
        _node(doc, pointer).update(values)
    if edits.get("ryzenai"):
        blocks = doc["model"]["decoder"]["session_options"]["provider_options"]
        next(b["RyzenAI"] for b in blocks if "RyzenAI" in b).update(edits["ryzenai"])
    (pkg / GENAI).write_text(json.dumps(doc, indent=2))
    for name in edits.get("write", []):
        if name.endswith(".onnx"):
            _tiny_graph(pkg / name)
        else:
            (pkg / name).write_text("{}")


def _build(make_pkg, tmp_path, case: dict) -> Path:
    if case["profile"]:
        pkg = make_pkg(case["profile"])
        named = pkg.parent / case["package"]
        pkg.rename(named)
        _apply(named, case["edits"])
        return named
    pkg = tmp_path / case["package"]
    pkg.mkdir()
    for name in case["files"]:
        if name.endswith(".onnx"):
            _tiny_graph(pkg / name)
        elif name == "config.json":
            arch = "Gemma3TextModel" if "embedding" in case["package"] else "Lfm2ForCausalLM"
            (pkg / name).write_text(json.dumps({"architectures": [arch]}))
        else:
            (pkg / name).write_bytes(b"\0" * 64 if name.endswith(".bin") else b'{"model": {"type": "BPE", "vocab": {}, "merges": []}}')
    return pkg


@pytest.mark.parametrize("name", sorted(DESCRIBED))
def test_each_amd_folder_kind_is_judged_as_its_loaders_read_it(make_pkg, tmp_path, capsys, name):
    case = DESCRIBED[name]
    judged = case["judged"]
    pkg = _build(make_pkg, tmp_path, case)
    with pytest.raises(SystemExit) as info:
        main(["validate", "--format", "json", str(pkg)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    if "exit" in judged:
        assert info.value.code == judged["exit"], out + err
    if "says" in judged:
        assert judged["says"] in err and "hint:" in err and "copy the complete package again" not in err
        return
    findings = json.loads(out)["results"][0]["findings"]
    errors = [(f["check_id"], f["path"]) for f in findings if f["severity"] == "error"]
    if "error" in judged:
        assert tuple(judged["error"]) in errors, findings
    for check_id in judged.get("no_error", []):
        assert check_id not in {c for c, _ in errors}, findings
    if "warning" in judged:
        assert tuple(judged["warning"]) in [(f["check_id"], f["path"]) for f in findings if f["severity"] == "warning"], findings
    if "hint_has" in judged:
        assert any(judged["hint_has"] in f["hint"] for f in findings if (f["check_id"], f["path"]) == tuple(judged["error"])), findings
    if "never" in judged:
        assert not any(judged["never"] in f["hint"] for f in findings), [f for f in findings if judged["never"] in f["hint"]]


def test_a_vision_graph_present_is_clean_of_rp109(make_pkg, tmp_path):
    case = DESCRIBED["vision-graph-missing"]
    pkg = _build(make_pkg, tmp_path, case)
    _tiny_graph(pkg / "vision.onnx")
    assert not [f for f in validate(pkg).findings if f.check_id == "RP109"]


def test_a_complete_llm_package_without_its_genai_config_is_still_a_broken_package(make_pkg, capsys):
    """The raw-ONNX refusal is for folders that are not LLM packages; AMD's LLM package that lost its
    genai_config.json still fails on the missing file (RP107), exit 1."""
    pkg = make_pkg("1.8.0-npu-16K")
    (pkg / GENAI).unlink()
    with pytest.raises(SystemExit) as info:
        main(["validate", str(pkg)])
    out, _err = capsys.readouterr()
    assert info.value.code == 1 and "RP107" in out and GENAI in out


def test_a_vision_section_without_its_processor_config_is_a_warning(make_pkg, tmp_path):
    case = DESCRIBED["vision-graph-missing"]
    pkg = _build(make_pkg, tmp_path, case)
    _tiny_graph(pkg / "vision.onnx")
    doc = json.loads((pkg / GENAI).read_text())
    del doc["model"]["vision"]["config_filename"]
    (pkg / GENAI).write_text(json.dumps(doc))
    found = [f for f in validate(pkg).findings if f.check_id == "RP109"]
    assert [(f.severity, f.pointer) for f in found] == [("warning", "/model/vision")], found
