"""One Finding and one error base (issue 12): the contract readers and the fuse rewrite report
`Finding`s, and every error a stage raises for bad input is a RaipackError (no per-module class
for a stage to catch and re-wrap)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from raipack.builder.stages import order
from raipack.core.errors import RaipackError
from raipack.core.findings import Finding
from raipack.npu.contract import io_contract

ROOT = Path(__file__).resolve().parents[2]
# Exceptions that never reach a user: each is caught where it is raised and becomes a finding or a RaipackError.
INTERNAL = {"ShapeError", "FormatError", "ReadError", "JsonError", "GitReadError", "NotFollowed", "MissingObject", "GraphRefused", "RuntimeRefusal", "RenderBudget", "HeaderError",
            "HeaderLimit", "_Refused", "NotFetched"}  # HeaderLimit: a HeaderError past raipack's reading bounds (RP112's finding); _Refused: raised inside lemonade's JSON hooks, one sentence by register; NotFetched: a check's read of an hf:// placeholder, turned into "skipped"; HeaderError: AMD's weights header unreadable, turned into an RP112 finding; RenderBudget: jinja2's SecurityError inside the sandbox, turned into one sentence by raipack eval


def _decoder(input_name: str = "input_ids") -> onnx.ModelProto:
    kv = [1, 2, "seq", 8]
    inputs = [helper.make_tensor_value_info(input_name, TensorProto.INT64, [1, "s"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "t"]),
              helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, kv),
              helper.make_tensor_value_info("past_key_values.0.value", TensorProto.FLOAT, kv)]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "s", 16]),
               helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, kv),
               helper.make_tensor_value_info("present.0.value", TensorProto.FLOAT, kv)]
    return helper.make_model(helper.make_graph([], "decoder", inputs, outputs))


GENAI = {"model": {"vocab_size": 16, "decoder": {
    "num_hidden_layers": 1, "num_key_value_heads": 2, "head_size": 8, "num_attention_heads": 2,
    "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
               "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
    "outputs": {"logits": "logits", "present_key_names": "present.%d.key", "present_value_names": "present.%d.value"}}}}


def test_contract_findings_are_findings():
    assert io_contract(_decoder(), GENAI) == []
    found = io_contract(_decoder("ids"), GENAI)
    assert found and all(isinstance(f, Finding) for f in found)
    assert {f.pointer for f in found} == {"input_ids", "ids"} and all(f.hint and f.severity == "error" for f in found)


def _exception_classes():
    """(module, class) for every exception class defined under pipeline/ and stages/ (as the installed raipack names them)."""
    for path in sorted((ROOT / "pipeline").rglob("*.py")) + sorted((ROOT / "stages").rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        names = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and any(
            isinstance(b, ast.Name) and (b.id.endswith(("Error", "Exception", "Refused", "Refusal", "Failed", "Crashed")) or b.id == "Exception")
            or isinstance(b, ast.Attribute) and b.attr.endswith("Error") for b in n.bases)]
        if names:
            top, *rest = path.relative_to(ROOT).with_suffix("").parts  # pipeline/ installs as raipack, stages/ as raipack.stages
            module = ".".join(["raipack", *(["stages"] if top == "stages" else []), *rest]).removesuffix(".__init__")
            yield module, names


def test_every_user_facing_error_is_a_raipack_error():
    seen, wrong = [], []
    for module, names in _exception_classes():
        mod = importlib.import_module(module)
        for name in names:
            cls = getattr(mod, name)
            seen.append(name)
            if issubclass(cls, BaseException) and name not in INTERNAL and not issubclass(cls, RaipackError):
                wrong.append(f"{module}.{name}")
    assert "GroupSizeError" in seen and "PackageError" in seen
    assert wrong == [], f"errors a user reads must be RaipackError(message, hint): {wrong}"


def test_stages_do_not_rewrap_errors():
    """A stage's run() lets RaipackError through: no `except XError: raise RaipackError(str(exc), ...)`."""
    paths = sorted((ROOT / "stages").glob("*/stage.py"))
    assert {p.parent.name for p in paths} >= set(order()), "a stage of the registry has no stages/<name>/stage.py to check"
    for path in paths:
        tree = ast.parse(path.read_text("utf-8"))
        for handler in (n for n in ast.walk(tree) if isinstance(n, ast.ExceptHandler)):
            for node in ast.walk(handler):
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and getattr(node.exc.func, "id", "") == "RaipackError":
                    args = node.exc.args
                    assert not (args and isinstance(args[0], ast.Call) and getattr(args[0].func, "id", "") == "str"), \
                        f"{path.relative_to(ROOT)}:{node.lineno} re-wraps an error as RaipackError(str(exc), ...)"
