"""A new Llama-shaped model family is one entry of the families table (pipeline/data/architectures.json):
the input check, quantize (linear shapes, memory), export (builder options) and fuse (layer matchers)
all read it, and no module of pipeline/ or stages/ keys code on a family's model_type by name.
docs/profiles.md states the measured file count this test holds."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest

from raipack.core.errors import UsageError
from raipack.npu import families

ROOT = Path(__file__).resolve().parents[2]
NEW = "llamalike"  # a fictitious model_type, shaped as Llama
CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 96}


@pytest.fixture
def with_new_family(monkeypatch):
    """The families table with one more entry, a copy of Llama's under a new model_type and architecture
    (what adding it to architectures.json does; the table is read through families.families())."""
    table = copy.deepcopy(families.families())
    table[NEW] = {**table["llama"], "architecture": "LlamalikeForCausalLM", "notes": "a test's Llama-shaped family"}
    monkeypatch.setattr(families, "families", lambda: table)
    return table


def _config(model_type: str, arch: str) -> dict:
    return {"architectures": [arch], "model_type": model_type, **CONFIG}


def test_the_input_check_takes_the_new_architecture_from_the_table(tmp_path, with_new_family):
    from raipack.builder.inputs import check_architecture

    check_architecture(tmp_path / "config.json", _config(NEW, "LlamalikeForCausalLM"))  # no refusal


def test_without_the_entry_the_architecture_is_refused(tmp_path):
    from raipack.builder.inputs import check_architecture

    with pytest.raises(UsageError, match="LlamalikeForCausalLM"):
        check_architecture(tmp_path / "config.json", _config(NEW, "LlamalikeForCausalLM"))


def test_quantize_export_and_fuse_treat_the_new_family_as_llama(with_new_family):
    from raipack.stages.export.families import extra_options
    from raipack.stages.quantize.memory import Shape
    from raipack.stages.quantize.preflight import linear_shapes

    assert linear_shapes(_config(NEW, "LlamalikeForCausalLM")) == linear_shapes(_config("llama", "LlamaForCausalLM")) is not None
    assert Shape.from_config(_config(NEW, "LlamalikeForCausalLM")) == Shape.from_config(_config("llama", "LlamaForCausalLM"))
    assert extra_options(NEW) == extra_options("llama")
    assert families.fuse_matchers() == list(dict.fromkeys(f["fuse_matcher"] for f in with_new_family.values() if f.get("fuse_matcher")))


def test_a_family_the_table_does_not_know_has_no_shapes():
    from raipack.stages.quantize.preflight import linear_shapes

    assert linear_shapes(_config(NEW, "LlamalikeForCausalLM")) is None


def _family_literals(source: str, names: set[str]) -> list[tuple[int, str]]:
    """Comparisons of a model_type with a family's name (`model_type == "qwen2"`, `model_type in ("phi3",)`)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if not any(isinstance(s, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)) and _is_model_type(s) for s in sides):
            continue
        consts = [c.value for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
        if any(c in names for c in consts):
            out.append((node.lineno, ast.unparse(node)))
    return out


def _is_model_type(node: ast.AST) -> bool:
    """A model_type value itself: `model_type`, `cfg.model_type`, `c["model_type"]`, `c.get("model_type")`
    (not a value derived from it, such as `families.linears_of(model_type)`, a layout name)."""
    if isinstance(node, ast.Name):
        return node.id == "model_type"
    if isinstance(node, ast.Attribute):
        return node.attr == "model_type"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "model_type"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "model_type")


def test_no_code_keys_on_a_family_name():
    """What a family needs is in its table entry; code that compares model_type with a family's name
    would make a new family of that shape a code change."""
    names = set(families.families())
    found = []
    for folder in ("pipeline", "stages"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += [f"{path.relative_to(ROOT)}:{line}: {text}" for line, text in _family_literals(path.read_text("utf-8"), names)]
    assert found == [], "put the family's trait in pipeline/data/architectures.json instead:\n" + "\n".join(found)


def test_the_scan_finds_a_family_comparison():
    assert _family_literals('def f(model_type, c):\n    return model_type == "qwen2" or c.get("model_type") in ("phi3",)\n', {"qwen2", "phi3"}) == [
        (2, "model_type == 'qwen2'"), (2, "c.get('model_type') in ('phi3',)")]
    assert _family_literals('def f(model_type):\n    return linears_of(model_type) == "phi3"\n', {"phi3"}) == []
