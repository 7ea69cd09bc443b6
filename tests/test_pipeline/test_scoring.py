"""The scoring runtime (pipeline/runtime/scoring.py): a held-out window's rows from its prefill, equal to the token
steps' rows of the same package, without touching the package's files."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest

from factory import reference_package
from raipack.runtime.heldout import package_perplexity
from raipack.runtime.reference import ReferenceRuntime
from raipack.runtime.scoring import LAST_ROW, ScoringRuntime, all_rows_graph

WINDOW = [(7 * i) % 500 + 4 for i in range(200)]


def stepped_rows(runtime, ids):
    return np.stack([runtime.prefill(ids[:1]).copy()] + [runtime.step(int(t)).copy() for t in ids[1:]])


@pytest.fixture(scope="module")
def pkg():
    return reference_package("reference-4K")


def test_the_windows_rows_come_from_one_prefill_and_equal_the_token_steps(pkg):
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in pkg.iterdir() if p.is_file()}
    scorer, stepper = ScoringRuntime(pkg), ReferenceRuntime(pkg)
    rows = scorer.rows(WINDOW)
    assert scorer.all_rows and rows.shape == (len(WINDOW), scorer.vocab_size)
    assert scorer.prefill_calls() == [256]  # the 200 tokens in one call of the 256 tier, not 200 calls
    np.testing.assert_allclose(rows, stepped_rows(stepper, WINDOW), rtol=1e-4, atol=1e-4)
    assert package_perplexity(scorer, WINDOW) == pytest.approx(package_perplexity(stepper, WINDOW), rel=1e-5)
    # answers are unchanged: the last real row after the prefill, then one row per step
    assert scorer.generate(WINDOW[:20], 8) == stepper.generate(WINDOW[:20], 8)
    assert before == {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in pkg.iterdir() if p.is_file()}


def test_under_bfp16_the_prefill_rows_differ_from_the_steps_only_by_when_the_kv_is_rounded(pkg):
    pytest.importorskip("quark", reason="BFP16 needs amd-quark (raipack's build extra)")
    scored = package_perplexity(ScoringRuntime(pkg, numerics="bfp16"), WINDOW)
    stepped = package_perplexity(ReferenceRuntime(pkg, numerics="bfp16"), WINDOW)
    floated = package_perplexity(ReferenceRuntime(pkg), WINDOW)
    assert scored == pytest.approx(stepped, rel=1e-2) and scored != floated


def test_a_graph_without_the_last_row_gather_is_left_alone_and_scored_by_steps(pkg):
    model = onnx.load(str(pkg / "model.onnx"), load_external_data=False)
    assert all_rows_graph(model) is True and not any(LAST_ROW in n.input for n in model.graph.node)
    plain = onnx.load(str(pkg / "model.onnx"), load_external_data=False)
    gather = next(n for n in plain.graph.node if n.name == LAST_ROW)
    gather.name = "/someone/else/Gather"
    copy = plain.SerializeToString()
    assert all_rows_graph(plain) is False and plain.SerializeToString() == copy

    class Stepping(ScoringRuntime):
        def _start_session(self, graph_path, model, names, values, threads):
            next(n for n in model.graph.node if n.name == LAST_ROW).name = "/someone/else/Gather"
            super()._start_session(graph_path, model, names, values, threads)

    runtime = Stepping(pkg)
    assert runtime.all_rows is False
    with pytest.raises(ValueError, match="no last-row Gather"):
        runtime.rows(WINDOW)
    assert package_perplexity(runtime, WINDOW) == pytest.approx(package_perplexity(ReferenceRuntime(pkg), WINDOW), rel=1e-6)
