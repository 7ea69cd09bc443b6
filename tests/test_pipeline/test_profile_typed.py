"""Profiles are read through their typed view (raipack.npu.spec.Profile), never by raw keys: the
view is frozen, a profile that lacks a field fails at load naming the file and the field, and no
raw-key read of a profile comes back into pipeline/ or stages/."""

from __future__ import annotations

import ast
import copy
import dataclasses
import json
from pathlib import Path

import pytest

from raipack.core.errors import RaipackError
from raipack.data import load_data
from raipack.npu import catalog
from raipack.npu import profile as profiles
from raipack.npu.spec import Profile, ProfileError, build
from raipack.npu.target import Target

ROOT = Path(__file__).resolve().parents[2]

# Names that hold a loaded profile in pipeline/ and stages/ (a subscript or .get() on one is a raw read),
# and calls that return one.
PROFILE_NAMES = {"profile", "prof", "target_profile"}
PROFILE_CALLS = {"get_profile", "reference_for", "for_model", "changed"}
# file -> why a subscript of a name above is not a raw profile read there (empty: no exception is needed)
ALLOWED: dict[str, str] = {}


def _holds_profile(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in PROFILE_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in PROFILE_NAMES
    if isinstance(node, ast.Call):
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
        return name in PROFILE_CALLS or (name == "get" and owner in ("profiles", "p"))
    if isinstance(node, ast.Subscript):  # all_profiles()[pid]
        return isinstance(node.value, ast.Call) and _call_name(node.value) == "all_profiles"
    return False


def raw_reads(source: str) -> list[tuple[int, str]]:
    """(line, text) of every `profile[...]`, `profile.get(...)`, `get_profile(x)[...]`, `all_profiles()[pid][...]` in `source`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and _holds_profile(node.value):
            out.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and _holds_profile(node.func.value):
            out.append((node.lineno, ast.unparse(node)))
    return out


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def test_no_raw_profile_reads_in_pipeline_or_stages():
    found = []
    for folder in ("pipeline", "stages"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ALLOWED:
                continue
            found += [f"{rel}:{line}: {text}" for line, text in raw_reads(path.read_text("utf-8"))]
    assert found == [], "read the typed profile (raipack.npu.spec.Profile) instead:\n" + "\n".join(found)


@pytest.mark.parametrize("text", ['profile["genai"]["search"]', 'ctx.profile.get("release")', 'prof["id"]',
                                  'profiles.get("x")["buckets"]', 'reference_for(t)["id"]', 'all_profiles()["x"]["target"]'])
def test_the_scan_finds_a_raw_read(text):
    assert raw_reads(f"def f(ctx, profile, prof, t):\n    return {text}\n"), text


def test_the_scan_passes_typed_reads_and_other_dicts():
    clean = "def f(ctx, profile, doc):\n    return profile.genai.search, ctx.profile.release, doc['id'], all_profiles()['x'], profile.document()['id']\n"
    assert raw_reads(clean) == []


def test_a_profile_has_no_raw_key_access_and_is_frozen():
    prof = profiles.get("1.8.0-npu-16K")
    assert not hasattr(prof, "__getitem__") and not hasattr(prof, "get")
    with pytest.raises(TypeError):
        prof["genai"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        prof.release = "9.9.9"
    with pytest.raises(TypeError):
        prof.genai.search["max_length"] = 1  # a read-only mapping
    assert isinstance(prof.buckets.token, tuple) and prof.target is Target.NPU


def test_the_typed_view_says_what_the_document_says():
    for pid, prof in profiles.all_profiles().items():
        doc = prof.document()
        assert (prof.id, prof.release, prof.target.value, prof.context, prof.fusion) == (pid, doc["release"], doc["target"], doc["context"], doc["fusion"])
        assert list(prof.buckets.prefill) == doc["buckets"]["prefill"] and list(prof.buckets.token) == doc["buckets"]["token"]
        assert set(prof.genai.options) == set(doc["genai"]["options"]) and dict(prof.genai.search) == doc["genai"]["search"]
        assert [c.why for c in prof.detect.content] == [c.get("why", "marker holds") for c in doc["detect"]["content"]]
        assert dict(prof.max_prompt_length) == doc["max_prompt_length"] and prof.quantization.group_size == doc["quantization"]["group_size"]
        assert prof.document() == doc and prof.document() is not prof.document()  # a fresh copy each time


def test_a_changed_copy_is_checked_again():
    base = profiles.get("reference-4K")
    bigger = profiles.changed(base, {"quantization": {"allowed_group_sizes": [32, 64]}})
    assert bigger.quantization.group_sizes() == (32, 64) and base.quantization.group_sizes() != (32, 64)
    with pytest.raises(ProfileError, match=r"/genai/search/max_length"):
        profiles.changed(base, {"genai": {"search": {"max_length": "long"}}})


def test_a_profile_document_without_a_field_fails_naming_file_and_field():
    doc = profiles.get("oga-export").document()
    del doc["genai"]["search"]
    with pytest.raises(ProfileError) as err:
        build(doc, "raipack/profiles/oga-export.json")
    assert "raipack/profiles/oga-export.json" in str(err.value) and "/genai" in str(err.value) and "search" in str(err.value)
    assert err.value.hint and isinstance(err.value, RaipackError) and err.value.exit_code == 2  # a user error (UsageError), not a crash


@pytest.fixture
def catalog_copy(tmp_path, monkeypatch):
    """Write a changed copy of the release catalog and make it the active one."""
    def write(change) -> Path:
        doc = copy.deepcopy(load_data("ryzenai_releases.json"))
        change(doc)
        path = tmp_path / "releases.json"
        path.write_text(json.dumps(doc))
        monkeypatch.setenv(catalog.CATALOG_ENV, str(path))
        profiles.reload()
        return path

    yield write
    monkeypatch.delenv(catalog.CATALOG_ENV, raising=False)
    profiles.reload()


def test_a_catalog_profile_missing_a_field_fails_at_load(catalog_copy):
    """A release entry whose `set` removes a field every profile needs (null removes a key) fails when
    the profiles load: one sentence naming the profile, where it came from and the field."""
    def drop_quantization(doc):
        rel = next(r for r in doc["releases"] if r["release"] == "1.8.0")
        rel["variants"]["npu-4K"].setdefault("set", {})["quantization"] = None

    path = catalog_copy(drop_quantization)
    with pytest.raises(ProfileError) as err:
        profiles.all_profiles()
    message = str(err.value)
    assert message.startswith("profile 1.8.0-npu-4K (") and str(path) in message and "quantization" in message, message
    assert "\n" not in message


def test_a_profile_pickles_as_its_document():
    import pickle

    prof = profiles.get("1.8.0-npu-16K")
    again = pickle.loads(pickle.dumps(prof))
    assert again == prof and again is not prof and again.genai.options == prof.genai.options


def test_profiles_compare_by_content_and_hash_by_id():
    a, b = profiles.get("1.8.0-npu-16K"), profiles.get("1.8.0-npu-16K")
    assert a == b and hash(a) == hash(b) and a != profiles.get("1.8.0-npu-4K")
    assert isinstance(a, Profile) and a in {b}
