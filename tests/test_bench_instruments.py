"""The bench's instruments measure what they say (issue 13): the synthetic export is the export
stage's MatMulNBits (its accuracy_level), its sparse form is the same graph with holes for weights,
and validate's bytes read are the kernel's count, whatever call reads them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import onnx

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import fuse_speed  # noqa: E402
import validate_speed  # noqa: E402

from factory import Dims, make_package  # noqa: E402
from raipack.stages.export.builder import CPU_FAITHFUL_OPTIONS  # noqa: E402

SMALL = Dims(layers=2, heads=4, kv_heads=2, head_size=64, intermediate=512, vocab=4096, context_length=256)


def _accuracy_levels(folder: Path) -> set[int]:
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    return {a.i for n in model.graph.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "accuracy_level"}


def test_synthetic_export_has_the_export_stages_accuracy_level(tmp_path):
    out = fuse_speed.synthetic_export(tmp_path / "dense", SMALL)
    assert _accuracy_levels(out) == {int(CPU_FAITHFUL_OPTIONS["accuracy_level"])}


def test_sparse_export_is_the_same_graph_with_holes(tmp_path):
    dense = fuse_speed.synthetic_export(tmp_path / "dense", SMALL)
    sparse = fuse_speed.synthetic_export(tmp_path / "sparse", SMALL, sparse=True)
    a, b = (onnx.load(str(d / "model.onnx"), load_external_data=False) for d in (dense, sparse))
    assert a.SerializeToString() == b.SerializeToString()
    size = (dense / "model.onnx.data").stat().st_size
    assert (sparse / "model.onnx.data").stat().st_size == size
    assert (sparse / "model.onnx.data").stat().st_blocks * 512 < size / 4  # the weights are holes
    assert json.loads((sparse / "genai_config.json").read_text()) == json.loads((dense / "genai_config.json").read_text())


def test_bytes_read_counts_every_read_path(tmp_path):
    """The old instrument wrapped builtins.open and saw 1024 B; the kernel sees at least the
    configs validate reads through Path.read_bytes/read_text."""
    pkg = make_package(tmp_path, "1.8.0-npu-16K")
    warm = make_package(tmp_path / "warm", "1.8.0-npu-16K")
    configs = sum((pkg / n).stat().st_size for n in ("genai_config.json", "config.json", "tokenizer.json"))
    io = validate_speed.bytes_read(pkg, warm)
    assert io["rchar"] >= configs
    assert io["syscr"] > 0
