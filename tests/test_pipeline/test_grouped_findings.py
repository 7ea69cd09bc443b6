"""Repeated findings said once: one finding per rule and file names its members compactly in text;
json and sarif keep every member (issue 23)."""

from __future__ import annotations

import json

from factory import Dims, make_package, write_json
from raipack.core import schemas
from raipack.core.findings import Finding, Result
from raipack.core.members import compact, grouped
from raipack.reporters import REPORTERS
from raipack.validate import validate


def test_compact_names_a_product_of_layers_and_kinds():
    names = [f"past_key_values.{i}.{k}" for i in range(2, 30) for k in ("key", "value")]
    assert compact(names) == "past_key_values.{2..29}.{key,value}"
    assert compact([f".cache\\MatMulNBits_2_0_{i}.const" for i in range(732)]) == ".cache\\MatMulNBits_2_0_{0..731}.const"
    assert compact(["a.1", "a.3", "a.7"]) == "a.{1,3,7}"


def test_compact_lists_names_that_are_not_a_product():
    assert compact(["x.1.key", "x.2.value"]) == "x.1.key, x.2.value"  # not every combination: no pattern that claims more
    assert compact(["alpha", "beta", "gamma", "delta"]) == "alpha, beta, gamma, … (4 in all)"


def test_grouped_keeps_every_member_and_one_alone_stays_as_it_was():
    one = [Finding("RP703", "error", "model.onnx", "graph input 'p.1' is missing", "re-export", "p.1")]
    assert grouped(one, "inputs missing") == one
    many = [Finding("RP703", "error", "model.onnx", f"graph input 'p.{i}' is missing", "re-export", f"p.{i}") for i in range(4)]
    [g] = grouped(many, "inputs missing")
    assert g.message == "p.{0..3}: 4 inputs missing" and g.members == ("p.0", "p.1", "p.2", "p.3") and g.hint == "re-export"


def _thirty_layer_config_over_two_layer_graph(tmp_path):
    pkg = make_package(tmp_path, "1.8.0-npu-16K", Dims(layers=2))
    genai = json.loads((pkg / "genai_config.json").read_text())
    genai["model"]["decoder"]["num_hidden_layers"] = 30
    write_json(pkg / "genai_config.json", genai)
    return validate(pkg, select=["RP703"])


def test_thirty_layer_config_over_two_layer_graph_is_two_findings_not_112(tmp_path):
    result = _thirty_layer_config_over_two_layer_graph(tmp_path)
    missing = [f for f in result.findings if f.members]
    assert [len(f.members) for f in missing] == [56, 56]
    inputs = next(f for f in missing if "input" in f.message)
    assert inputs.message.startswith("past_key_values.{2..29}.{key,value}: 56 graph inputs missing")
    text = REPORTERS["text"]([result], 1)
    assert "past_key_values.{2..29}.{key,value}: 56 graph inputs missing" in text
    assert "present.{2..29}.{key,value}: 56 graph outputs missing" in text
    assert len([line for line in text.splitlines() if " RP703 " in line]) == len(result.findings) <= 4


def test_json_and_sarif_keep_every_member(tmp_path):
    result = _thirty_layer_config_over_two_layer_graph(tmp_path)
    report = json.loads(REPORTERS["json"]([result], 1))
    assert schemas.errors("report", report) == []
    members = [m for f in report["results"][0]["findings"] for m in f.get("members", [])]
    assert len(members) == 112 and "past_key_values.29.value" in members and "present.2.key" in members
    sarif = json.loads(REPORTERS["sarif"]([result], 1))
    sarif_members = [m for r in sarif["runs"][0]["results"] for m in r.get("properties", {}).get("members", [])]
    assert sorted(sarif_members) == sorted(members)


def test_text_prints_five_findings_of_one_rule_on_a_file_then_how_many_more():
    findings = [Finding("RP702", "error", "model.onnx", f"tensor w{i} lies outside model.onnx.data", "copy again", f"w{i}") for i in range(12)]
    findings.append(Finding("RP701", "warning", "model.onnx", "uses operator domain 'x'", "", "x"))
    text = REPORTERS["text"]([Result("pkg", "p", "why", findings)], 1)
    assert len([line for line in text.splitlines() if line.strip().startswith("error RP702 ")]) == 5
    assert "… 7 more RP702 errors on this file (the json and sarif reports list every one)" in text
    assert "RP701 uses operator domain 'x'" in text
    assert len(json.loads(REPORTERS["json"]([Result("pkg", "p", "why", findings)], 1))["results"][0]["findings"]) == 13


def test_a_missing_data_file_is_one_finding_for_all_its_tensors(tmp_path):
    pkg = make_package(tmp_path, "1.8.0-npu-16K", Dims(layers=4))
    (pkg / "model.onnx.data").unlink()
    [found] = validate(pkg, select=["RP702"]).findings
    assert found.severity == "error" and len(found.members) == 2 + 3 * 4  # embedding, lm_head, 3 tensors per layer
    assert f": {len(found.members)} tensors point at 'model.onnx.data', which does not exist" in found.message
    assert "model.embed_tokens.weight" in found.members
