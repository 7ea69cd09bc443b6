"""The JSON Schemas, driven by folders of examples.

tests/schemas/valid/<schema>/*.json must validate cleanly;
tests/schemas/invalid/<schema>/*.json must each produce an error at the JSON
pointer that the folder's expected.json gives for that file name.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from raipack.core import schema_files, schemas
from raipack.core.errors import UsageError

HERE = Path(__file__).parent
SIDECAR = "expected.json"
KINDS = [
    "genai_config", "quantization_config", "model_config", "rai_config", "cache_meta",
    "generation_config", "manifest", "report", "profile", "recipe", "metastate_plan", "metastate_schedule",
    "ort_model_package", "matrix",
]


def examples(top: str) -> list[Path]:
    return sorted(p for p in (HERE / top).glob("*/*.json") if p.name != SIDECAR)


def ids(paths):
    return [f"{p.parent.name}/{p.stem}" for p in paths]


def read(path: Path):
    return json.loads(path.read_text("utf-8"))


def expected_pointer(path: Path) -> str:
    table = read(path.parent / SIDECAR)
    assert path.name in table, f"{path.parent / SIDECAR} has no entry for {path.name}"
    return table[path.name]


# ------------------------------------------------------------ the schemas


def test_every_kind_has_a_schema():
    assert sorted(schemas.names()) == sorted(KINDS)


@pytest.mark.parametrize("name", KINDS)
def test_schema_is_well_formed(name):
    schema = schemas.load(name)
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == f"https://raipack.dev/schemas/{name}.schema.json"
    assert schema["title"] and schema["description"]


def test_load_returns_a_fresh_copy():
    a = schemas.load("rai_config")
    a["title"] = "changed"
    assert schemas.load("rai_config")["title"] != "changed"


def test_unknown_schema_is_a_usage_error():
    with pytest.raises(UsageError, match="no schema named 'nope'") as info:
        schemas.load("nope")
    assert "genai_config" in info.value.hint
    with pytest.raises(UsageError):
        schemas.validator("nope")


def test_validator_is_cached_and_draft_2020_12():
    v = schemas.validator("manifest")
    assert v is schemas.validator("manifest")
    assert isinstance(v, Draft202012Validator)


def test_repo_fallback_folder_holds_every_schema():
    on_disk = sorted(p.name[: -len(".schema.json")] for p in schemas.REPO_DIR.glob("*.schema.json"))
    assert on_disk == sorted(KINDS)


def test_shipped_profiles_validate():
    """Every profile as the code sees it (`extends` resolved, each model override applied)."""
    from raipack.npu import catalog, profile

    folder = HERE.parent.parent / "pipeline" / "profiles"
    assert sorted(profile.file_profiles()) == sorted(p.stem for p in folder.glob("*.json"))
    assert set(profile.raw_profiles()) == set(profile.file_profiles()) | set(catalog.release_profiles())
    for pid, prof in profile.all_profiles().items():
        assert schemas.errors("profile", prof.document()) == [], pid
        for model_type in prof.model_overrides:
            assert schemas.errors("profile", profile.for_model(prof, model_type).document()) == [], (pid, model_type)


def test_profile_derivation_merges_objects_and_replaces_the_rest():
    from raipack.npu import profile

    merged = profile.merge({"a": {"x": 1, "y": [1, 2]}, "b": 1}, {"a": {"y": [3]}, "c": 2})
    assert merged == {"a": {"x": 1, "y": [3]}, "b": 1, "c": 2}
    ref = profile.all_profiles()["reference-1.7.1-16K"]
    base = profile.all_profiles()["1.7.1-npu-16K"]
    assert ref.buckets == base.buckets and ref.genai == base.genai and ref.release == "1.7.1"
    assert ref.metastate.tiered and not base.metastate.tiered
    assert profile.reference_for(base).id == "reference-1.7.1-16K"
    phi = profile.for_model(profile.all_profiles()["1.8.0-npu-16K"], "phi3")
    assert phi.genai.search["chunk_size"] == 8192 and max(phi.buckets.prefill) == 8192
    assert profile.for_model(profile.all_profiles()["1.8.0-npu-16K"], "llama").genai.search["chunk_size"] == 4096


# ------------------------------------------------------------ the examples


def test_every_kind_has_enough_examples():
    for name in KINDS:
        if name in ("profile", "metastate_plan"):  # tested on the shipped profiles / on the plans real fuse runs write (test_fuse.py)
            continue
        assert len(list((HERE / "valid" / name).glob("*.json"))) >= 4, name
        invalid = [p for p in (HERE / "invalid" / name).glob("*.json") if p.name != SIDECAR]
        assert len(invalid) >= 3, name
        assert sorted(read(HERE / "invalid" / name / SIDECAR)) == sorted(p.name for p in invalid)


@pytest.mark.parametrize("path", examples("valid"), ids=ids(examples("valid")))
def test_valid_example(path):
    assert schemas.errors(path.parent.name, read(path)) == []


@pytest.mark.parametrize("path", examples("invalid"), ids=ids(examples("invalid")))
def test_invalid_example(path):
    found = schemas.errors(path.parent.name, read(path))
    pointer = expected_pointer(path)
    assert pointer in [p for p, _ in found], found
    for p, message in found:
        assert message.startswith(p or "the document"), message
        assert "is not valid under any of the given schemas" not in message


# ------------------------------------------------------------ the messages


def genai(search=None, **model):
    doc = {"model": {"type": "llama", "decoder": {"filename": "model.onnx"}, **model}}
    if search is not None:
        doc["search"] = search
    return doc


def test_message_for_a_wrong_type():
    assert schemas.errors("genai_config", genai({"max_length": "4096"})) == [
        ("/search/max_length", '/search/max_length is "4096" (a string); expected an integer'),
    ]


def test_message_for_a_range():
    assert schemas.errors("genai_config", genai({"top_p": 1.5, "num_beams": 0})) == [
        ("/search/num_beams", "/search/num_beams is 0; expected an integer of at least 1"),
        ("/search/top_p", "/search/top_p is 1.5; expected a number from 0 to 1"),
    ]


def test_message_for_a_missing_field_points_at_the_field():
    doc = {"model": {"type": "llama", "decoder": {}}}
    assert schemas.errors("genai_config", doc) == [
        ("/model/decoder/filename",
         "/model/decoder/filename is missing; expected a relative path inside the package, such as model.onnx"),
    ]


def test_any_of_whose_types_all_fail_lists_the_choices():
    assert schemas.errors("genai_config", genai(eos_token_id="2")) == [
        ("/model/eos_token_id",
         '/model/eos_token_id is "2" (a string); expected a token id or a non-empty array of token ids'),
    ]


def test_any_of_reports_the_branch_the_value_was_meant_for():
    found = schemas.errors("genai_config", genai(eos_token_id=[2, "3"]))
    assert found == [("/model/eos_token_id/1", '/model/eos_token_id/1 is "3" (a string); expected a token id (an integer of at least 0)')]
    doc = {"quant_method": "quark", "global_quant_config": {}, "algo_config": [{"name": "awq", "scaling_layers": "x"}]}
    found = schemas.errors("quantization_config", doc)
    assert [p for p, _ in found] == ["/algo_config/0/scaling_layers"]
    assert "expected an array of objects" in found[0][1]


def test_profile_condition_reports_the_matching_form():
    base = {"file": "genai_config.json", "pointer": "/search/max_length"}
    found = schemas.errors("profile", {"detect": {"content": [dict(base, gt="4096")]}})
    assert ("/detect/content/0/gt", '/detect/content/0/gt is "4096" (a string); expected a number') in found
    found = dict(schemas.errors("profile", {"detect": {"content": [{"file": "x"}]}}))
    assert found["/detect/content/0"].startswith('/detect/content/0 is {"file": "x"}; expected a condition:')


def test_message_for_a_bad_key():
    assert schemas.errors("rai_config", {"max_prompt_length": {"v1.8": 4096}}) == [
        ("/max_prompt_length/v1.8",
         '/max_prompt_length/v1.8: the key "v1.8" is not allowed; expected a Ryzen AI version such as 1.8.0'),
    ]


def test_message_for_an_unknown_field_of_a_strict_object():
    found = dict(schemas.errors("profile", {"metastate": {"required": True, "siblings": [], "optional_siblings": [], "tiered": False, "sibling": []}}))
    assert found["/metastate/sibling"] == (
        "/metastate/sibling is not a known field; /metastate may only have required, siblings, optional_siblings, tiered, ship_together"
    )


def test_message_for_const_enum_and_pattern():
    found = dict(schemas.errors("manifest", {"format": "x", "complete": False, "files": [{"path": "a/../b", "size": 1, "role": "r", "sha256": "z"}]}))
    assert found["/format"] == '/format is "x"; expected "raipack-manifest"'
    assert found["/complete"] == "/complete is false; expected true"
    assert found["/files/0/path"].startswith('/files/0/path is "a/../b"; expected a relative POSIX path')
    assert found["/files/0/sha256"] == '/files/0/sha256 is "z"; expected a sha256 digest (64 lowercase hex digits)'
    found = dict(schemas.errors("report", {"results": [{"findings": [{"severity": "fatal"}]}]}))
    assert found["/results/0/findings/0/severity"] == (
        '/results/0/findings/0/severity is "fatal"; expected one of "error", "warning", "advice", "info"'
    )


def test_message_for_the_whole_document():
    assert schemas.errors("rai_config", [1]) == [("", "the document is [1] (an array); expected an object")]


def test_long_values_are_truncated():
    (pointer, message), = schemas.errors("genai_config", genai({"max_length": "x" * 500}))
    shown = message.split(" is ", 1)[1].split(" (a string)")[0]
    assert len(shown) == 60 and shown.endswith("…")


def test_model_config_checks_quark_config_only():
    gptq = {"quantization_config": {"quant_method": "gptq", "bits": "4"}}
    assert schemas.errors("model_config", gptq) == []
    quark = {"quantization_config": {"quant_method": "quark", "global_quant_config": {"weight": {"dtype": "uint4", "group_size": "128"}}}}
    assert [p for p, _ in schemas.errors("model_config", quark)] == [
        "/quantization_config/global_quant_config/weight/group_size"
    ]


def test_errors_are_sorted_and_unique():
    doc = {"model": {"type": 1, "decoder": {"filename": 2}}, "search": {"top_k": -1, "do_sample": "no"}}
    found = schemas.errors("genai_config", doc)
    assert found == sorted(set(found))
    assert [p for p, _ in found] == ["/model/decoder/filename", "/model/type", "/search/do_sample", "/search/top_k"]


def test_loader_falls_back_to_the_repo_folder(monkeypatch):
    monkeypatch.setattr(schema_files, "PACKAGE", "raipack_no_such_package")
    schema_files._folder.cache_clear()
    try:
        assert schema_files._folder() == schemas.REPO_DIR
        assert "manifest" in schemas.names()
    finally:
        monkeypatch.undo()
        schema_files._folder.cache_clear()
