"""The package README's Hugging Face front matter (pipeline/builder/model_card.py): parsed back with
PyYAML (installed with transformers), its keys, base_model only as the source names itself,
license from the source, model-index only with eval results, the honest note on the reference
backend kept; and a (fake-stage) build writes it."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from raipack.builder.model_card import append_build_numbers, split_front_matter

BODY = ("# m — raipack reference package (reference-16K)\n\n**The binary files (...) are in raipack's own documented open format. "
        "They are NOT loadable by AMD's proprietary Ryzen AI runtime.**\n")
REPORT = {"model": "SmolLM2-135M-Instruct", "profile": "1.8.0-npu-16K", "seconds": 12.0, "tools": {"raipack": "0.1.0"},
          "stages": [{"name": "quantize", "status": "built", "seconds": 1.0, "report": {"algorithm": "awq", "scheme": "uint4_wo_64", "summary": "awq"}},
                     {"name": "fuse", "status": "built", "seconds": 1.0, "report": {"backend": "reference", "summary": "fused"}}]}
EVAL = {"results": {"arc_easy": {"alias": "arc_easy", "acc,none": 0.5, "acc_stderr,none": 0.1, "acc_norm,none": 0.25}}, "versions": {"arc_easy": 1.0},
        "n-shot": {"arc_easy": 0}, "configs": {}}


def card(tmp_path, report=REPORT, name_or_path=None, source_files=None):
    pkg, source = tmp_path / "pkg", tmp_path / "source"
    pkg.mkdir(exist_ok=True)
    source.mkdir(exist_ok=True)
    (pkg / "README.md").write_text(BODY)
    (pkg / "config.json").write_text(json.dumps({"_name_or_path": name_or_path} if name_or_path else {}))
    for name, text in (source_files or {}).items():
        (source / name).write_text(text)
    append_build_numbers(pkg / "README.md", report, source=source)
    text = (pkg / "README.md").read_text()
    assert text.startswith("---\n")
    meta, body = split_front_matter(text)
    assert meta == yaml.safe_load(text.split("---\n")[1])  # valid YAML, parsed back by PyYAML itself
    return meta, text, body


def test_front_matter_keys_and_the_honest_body(tmp_path):
    meta, text, body = card(tmp_path, name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct",
                            source_files={"README.md": "---\nlicense: apache-2.0\nlanguage: [en]\n---\n# SmolLM2\n"})
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert meta["base_model_relation"] == "quantized" and meta["license"] == "apache-2.0"
    assert meta["library_name"] == "onnxruntime-genai" and meta["pipeline_tag"] == "text-generation"
    assert meta["tags"] == ["ryzenai", "npu", "awq", "uint4", "ryzenai-1.8.0", "1.8.0-npu-16K"]
    assert "model-index" not in meta
    assert "# raipack reference package: its NPU files are raipack's open formats" in text.split("---\n")[1]
    assert "NOT loadable by AMD's proprietary Ryzen AI runtime" in body and "## Build record" in body


def test_base_model_is_never_invented(tmp_path):
    for value in (None, "/tmp/some/local/folder", "./fp", "SmolLM2-135M-Instruct"):
        meta, text, _ = card(tmp_path, name_or_path=value)
        assert "base_model" not in meta, value
        assert "# base_model omitted: the source model's config.json names no hub id (_name_or_path), and raipack does not guess one" in text


@pytest.mark.parametrize("files, expected", [({"LICENSE": "MIT License\n\nPermission is hereby granted, free of charge"}, "mit"),
                                             ({"LICENSE.txt": "Apache License\nVersion 2.0, January 2004"}, "apache-2.0"),
                                             ({"LICENSE": "All rights reserved."}, None), ({}, None)])
def test_license_from_the_source_license_file(tmp_path, files, expected):
    meta, _, _ = card(tmp_path, source_files=files)
    assert meta.get("license") == expected


def test_model_index_only_with_eval_results(tmp_path):
    report = copy.deepcopy(REPORT)
    report["eval"] = EVAL
    meta, _, _ = card(tmp_path, report=report)
    [entry] = meta["model-index"]
    assert entry["name"] == "SmolLM2-135M-Instruct"
    [result] = entry["results"]
    assert result["dataset"] == {"name": "arc_easy", "type": "arc_easy"} and result["task"]["type"] == "text-generation"
    assert result["metrics"] == [{"name": "acc", "type": "acc", "value": 0.5}, {"name": "acc_norm", "type": "acc_norm", "value": 0.25}]
    report["eval"] = {"raipack": {"chain": [{"stage": "source", "results": {"t": {"acc,none": 0.9}}}, {"stage": "package", "results": {"t": {"acc,none": 0.7}}}]}}
    meta, _, _ = card(tmp_path, report=report)
    assert meta["model-index"][0]["results"][0]["metrics"] == [{"name": "acc", "type": "acc", "value": 0.7}]  # the package's, the chain's last
    report["eval"] = {"results": {}}
    assert "model-index" not in card(tmp_path, report=report)[0]


def test_rewriting_keeps_one_front_matter_and_one_build_record(tmp_path):
    card(tmp_path)
    readme = tmp_path / "pkg" / "README.md"
    append_build_numbers(readme, REPORT)
    text = readme.read_text()
    assert text.count("\n---\n") == 1 and text.startswith("---\n") and text.count("## Build record") == 1


def test_sdk_packages_get_no_reference_note(tmp_path):
    report = copy.deepcopy(REPORT)
    report["stages"][1]["report"]["backend"] = "ryzenai-sdk"
    _, text, _ = card(tmp_path, report=report)
    assert "raipack reference package" not in text.split("---\n")[1]


def test_a_build_writes_the_front_matter(tmp_path, monkeypatch):
    import fake_stages
    from raipack.builder.recipe import load
    from raipack.builder.runner import build
    from raipack.validate import validate

    monkeypatch.setenv("RAIPACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fake_stages, "CALLS", tmp_path / "calls.txt")
    monkeypatch.setattr("raipack.builder.stages.get", fake_stages.FAKES.__getitem__)
    monkeypatch.chdir(tmp_path)
    result = build(load(None, {"output": "build"}))
    meta, _ = split_front_matter((result.package / "README.md").read_text())
    assert meta["library_name"] == "onnxruntime-genai" and "1.8.0-npu-16K" in meta["tags"]
    assert validate(result.package).failed() is False
