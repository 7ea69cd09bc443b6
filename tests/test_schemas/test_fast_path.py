"""The compiled validator (jsonschema-rs) against jsonschema: the same verdict on every document.

`schemas.errors` takes the compiled validator's verdict and runs jsonschema only to word the
errors of an invalid document, so the two must agree: on every schema's valid and invalid examples,
on the shipped profiles, on every JSON file of a real package, and on mutations of all of these.
"""

from __future__ import annotations

import copy
import importlib
import json
import random
import sys
from pathlib import Path

import pytest

from factory import reference_package
from raipack.checks.jsonfiles import SCHEMA_OF_ROLE
from raipack.core import schemas
from raipack.core.errors import RaipackError
from raipack.core.package import role_of

HERE = Path(__file__).parent
PROFILES = HERE.parent.parent / "pipeline" / "profiles"
MUTATIONS_PER_DOC = 40
MUTATIONS_PER_PROFILE = 15  # 19 resolved profiles, much alike
UNKNOWN_KEY = "x_not_in_any_schema"

pytestmark = pytest.mark.skipif(schemas.jsonschema_rs is None, reason="jsonschema-rs is not installed: nothing to compare")


def verdicts(name: str, doc) -> tuple[bool, bool]:
    """(compiled, jsonschema) verdicts of `doc` under schema `name`."""
    return schemas.fast_validator(name).is_valid(doc), schemas.validator(name).is_valid(doc)


def examples() -> list[tuple[str, str, object]]:
    """(schema, label, document) of tests/test_schemas/valid|invalid/<schema>/*.json."""
    out = []
    for path in sorted(HERE.glob("*/*/*.json")):
        if path.parent.parent.name in ("valid", "invalid") and path.name != "expected.json":
            out.append((path.parent.name, f"{path.parent.parent.name}/{path.parent.name}/{path.stem}", json.loads(path.read_text("utf-8"))))
    return out


def shipped_profiles() -> list[tuple[str, str, object]]:
    """Every profile file as written and as the code sees it (`extends` resolved, model overrides applied)."""
    from raipack.npu import profile

    out = [("profile", f"file/{p.stem}", json.loads(p.read_text("utf-8"))) for p in sorted(PROFILES.glob("*.json"))]
    for pid, prof in sorted(profile.all_profiles().items()):
        out.append(("profile", f"resolved/{pid}", prof.document()))
        out += [("profile", f"resolved/{pid}/{m}", profile.for_model(prof, m).document()) for m in sorted(prof.model_overrides)]
    return out


def schema_for(rel: str, doc) -> str | None:
    """The schema raipack's checks hold a package file to: by its role, else by its `format` marker."""
    role = role_of(rel)
    by_format = {s["properties"]["format"]["const"]: n for n in schemas.names()
                 if "const" in (s := schemas.load(n)).get("properties", {}).get("format", {})}
    if SCHEMA_OF_ROLE.get(role) or role in schemas.names():
        return SCHEMA_OF_ROLE.get(role, role)
    return by_format.get(doc.get("format")) if isinstance(doc, dict) and isinstance(doc.get("format"), str) else None


def package_documents(pid: str) -> list[tuple[str, str, object]]:
    """(schema, file, document) for every file of the real package `pid` that is JSON of a known schema."""
    root = reference_package(pid)
    out = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        with open(path, "rb") as fh:
            if fh.read(1) not in (b"{", b"["):
                continue
        try:
            doc = json.loads(path.read_bytes())
        except ValueError:
            continue
        rel = path.relative_to(root).as_posix()
        name = schema_for(rel, doc)
        if name:
            out.append((name, rel, doc))
    return out


# ------------------------------------------------------------------ mutations


def _other(value):
    """A value of another JSON type."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return 7
    if isinstance(value, list):
        return {"0": value[0]} if value else {}
    if isinstance(value, dict):
        return list(value.values())[:1]
    return 0


def _nodes(doc, path=()):
    """(path, node) of every object and array, outermost first."""
    if isinstance(doc, (dict, list)):
        yield path, doc
        items = doc.items() if isinstance(doc, dict) else enumerate(doc)
        for key, value in items:
            yield from _nodes(value, path + (key,))


def _at(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def mutations(doc, seed: str, most: int = MUTATIONS_PER_DOC) -> list[tuple[str, object]]:
    """Deterministic edits of `doc`: a key dropped, a value of another type, an unknown key added."""
    edits = []
    for path, node in _nodes(doc):
        if isinstance(node, dict):
            edits.append(("add", path, UNKNOWN_KEY))
            edits += [(kind, path, key) for key in node for kind in ("drop", "retype")]
        else:
            edits += [("retype", path, i) for i in range(len(node))]
    rng = random.Random(seed)
    chosen = sorted(rng.sample(range(len(edits)), min(most, len(edits))))
    out = []
    for kind, path, key in (edits[i] for i in chosen):
        new = copy.deepcopy(doc)
        node = _at(new, path)
        if kind == "drop":
            del node[key]
        elif kind == "add":
            node[key] = 1
        else:
            node[key] = _other(node[key])
        out.append((f"{kind} {schemas.pointer_of(path + (key,))}", new))
    return out


# ------------------------------------------------------------------ the verdicts


@pytest.mark.parametrize("name, label, doc", examples(), ids=[label for _, label, _ in examples()])
def test_examples_get_the_same_verdict(name, label, doc):
    fast, slow = verdicts(name, doc)
    assert fast == slow
    assert fast == label.startswith("valid/"), "the example folder says the other verdict"


def test_shipped_profiles_get_the_same_verdict():
    docs = shipped_profiles()
    assert len(docs) > len(list(PROFILES.glob("*.json")))
    found = {label: verdicts(name, doc) for name, label, doc in docs}
    assert [label for label, (fast, slow) in found.items() if fast != slow] == []
    assert all(fast for label, (fast, _) in found.items() if label.startswith("resolved/"))


@pytest.mark.parametrize("pid", ["reference-16K", "reference-4K"])
def test_package_files_get_the_same_verdict(pid):
    docs = package_documents(pid)
    kinds = {name for name, _, _ in docs}
    assert {"genai_config", "manifest", "metastate_plan"} <= kinds, kinds
    assert [(rel, *verdicts(name, doc)) for name, rel, doc in docs] == [(rel, True, True) for _, rel, _ in docs]


def test_mutations_get_the_same_verdict():
    """Valid examples, resolved profiles and a real plan, each edited a few dozen ways."""
    valid = [(n, label, doc, MUTATIONS_PER_DOC) for n, label, doc in examples() if label.startswith("valid/")]
    profiles = [(*d, MUTATIONS_PER_PROFILE) for d in shipped_profiles() if d[1].startswith("resolved/")]
    plan = next(d for d in package_documents("reference-16K") if d[0] == "metastate_plan")
    differ, counts = [], {True: 0, False: 0}
    for name, label, doc, most in valid + profiles + [(*plan, MUTATIONS_PER_DOC)]:
        for edit, new in mutations(doc, label, most):
            fast, slow = verdicts(name, new)
            counts[slow] += 1
            if fast != slow:
                differ.append((label, edit, fast, slow))
    assert differ == []
    assert counts[False] > 100 and counts[True] > 100, counts  # the edits reach both verdicts


def test_mutations_are_deterministic_and_of_each_kind():
    doc = {"a": {"b": [1, "x"]}, "c": True}
    first = mutations(doc, "seed")
    assert first == mutations(doc, "seed")
    assert {edit.split()[0] for edit, _ in first} == {"drop", "retype", "add"}
    assert doc == {"a": {"b": [1, "x"]}, "c": True}


# ------------------------------------------------------------------ how errors() uses them


def test_errors_of_a_valid_document_never_run_jsonschema(monkeypatch):
    name, _, doc = next(e for e in examples() if e[1].startswith("valid/genai_config"))
    monkeypatch.setattr(schemas, "validator", lambda name: pytest.fail("jsonschema ran on a valid document"))
    assert schemas.errors(name, doc) == []
    assert schemas.is_valid(name, doc)


def test_errors_of_an_invalid_document_are_worded_by_jsonschema():
    found = schemas.errors("genai_config", {"model": {"type": "llama", "decoder": {"filename": "model.onnx"}}, "search": {"max_length": "4096"}})
    assert found == [("/search/max_length", '/search/max_length is "4096" (a string); expected an integer')]


class Count(int):
    """An int subclass: jsonschema takes it as an integer, jsonschema-rs refuses to convert it."""


def test_what_jsonschema_rs_cannot_take_is_decided_by_jsonschema():
    genai = {"model": {"type": "llama", "decoder": {"filename": "model.onnx"}}}
    good, bad = dict(genai, search={"max_length": Count(4096)}), dict(genai, search={"top_p": Count(3)})
    with pytest.raises(ValueError):
        schemas.fast_validator("genai_config").is_valid(good)
    assert schemas.is_valid("genai_config", good) and schemas.errors("genai_config", good) == []
    assert not schemas.is_valid("genai_config", bad)
    assert schemas.errors("genai_config", bad) == [("/search/top_p", "/search/top_p is 3; expected a number from 0 to 1")]


def test_what_jsonschema_rs_rejects_jsonschema_has_the_last_word_on():
    """Python's `$` also matches before a final newline, ECMA-262's (jsonschema-rs) does not: where the
    compiled validator is the stricter one, the verdict stays jsonschema's, as it always was."""
    doc = json.loads((HERE / "valid" / "manifest" / "package.json").read_text("utf-8"))
    doc["files"][0]["sha256"] += "\n"
    assert verdicts("manifest", doc) == (False, True)
    assert schemas.is_valid("manifest", doc) and schemas.errors("manifest", doc) == []


def test_without_jsonschema_rs_jsonschema_does_everything(monkeypatch):
    """An odd platform with no jsonschema-rs wheel: the import fails and raipack still validates."""
    monkeypatch.setitem(sys.modules, "jsonschema_rs", None)  # `import jsonschema_rs` raises ImportError
    importlib.reload(schemas)
    try:
        assert schemas.jsonschema_rs is None and schemas.fast_validator("manifest") is None
        for name, label, doc in examples():
            assert (schemas.errors(name, doc) == []) == label.startswith("valid/"), label
            assert schemas.is_valid(name, doc) == label.startswith("valid/"), label
        assert schemas.errors("rai_config", [1]) == [("", "the document is [1] (an array); expected an object")]
    finally:
        monkeypatch.undo()
        importlib.reload(schemas)
    assert schemas.fast_validator("manifest") is not None


def test_each_schema_is_compiled_once():
    assert schemas.fast_validator("metastate_plan") is schemas.fast_validator("metastate_plan")


def test_unknown_schema_is_a_usage_error_on_the_fast_path_too():
    from raipack.core.errors import UsageError

    with pytest.raises(UsageError, match="no schema named 'nope'"):
        schemas.fast_validator("nope")


# ------------------------------------------------------------------ no network, same format rule


def test_a_remote_ref_is_refused_not_fetched():
    evil = {"$id": "https://raipack.dev/schemas/evil.schema.json",
            "properties": {"x": {"$ref": "https://example.com/evil.schema.json"}}}
    with pytest.raises(RaipackError, match="refers to https://example.com/evil.schema.json, which is not one of raipack's schemas") as info:
        schemas.compile_schema(evil)
    assert "schemas/ folder" in info.value.hint


def test_refs_to_raipack_schemas_resolve_offline():
    """profile.schema.json $refs genai_config's and rai_config's $defs by their raipack.dev $id."""
    refs = {"$id": "https://raipack.dev/schemas/probe.schema.json",
            "properties": {"search": {"$ref": "https://raipack.dev/schemas/genai_config.schema.json#/$defs/search"}}}
    v = schemas.compile_schema(refs)
    assert v.is_valid({"search": {"max_length": 4096}})
    assert not v.is_valid({"search": {"max_length": "4096"}})


def test_format_is_an_annotation_on_both_paths():
    from jsonschema import Draft202012Validator

    assert schemas.compile_schema({"format": "date-time"}).is_valid("not a date")
    assert Draft202012Validator({"format": "date-time"}).is_valid("not a date")
    manifest = next(doc for name, label, doc in examples() if label.startswith("valid/manifest") and "created" in doc)
    loose = dict(manifest, created="2025-13-45T99:99:99Z")  # matches the pattern, is no real date
    assert verdicts("manifest", loose) == (True, True)
