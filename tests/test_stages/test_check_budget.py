"""The checks' token budget (issue 41; raipack.runtime.budget): the full 256 tokens and 16-token answers up to 0.6B
forward parameters, fewer in proportion above; an explicit setting is kept; a bad one is refused before any stage
runs. The quantize probes, the export's parity perplexity and the smoke stage's window (the export's) use it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raipack.core.errors import UsageError
from raipack.runtime.budget import forward_parameters, probe_budget, probes_data
from raipack.stages.quantize.stage import QuantizeConfig, preflight

MODELS = json.loads((Path(__file__).resolve().parents[2] / "bench" / "real_models.json").read_text())


def test_the_budget_shrinks_with_the_models_forward_cost():
    data = probes_data()
    one, three, eight = (probe_budget(MODELS[m]) for m in ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b"))
    small = probe_budget({**MODELS["llama-3.2-1b"], "num_hidden_layers": 2})  # 0.38B forward parameters, the lm_head most of them
    assert (small.tokens, small.answer_tokens) == (data["perplexity_tokens"], data["answer_tokens"]) == (256, 16)
    assert (one.tokens, one.answer_tokens) == (124, 8) and "1.24B forward parameters, scale 0.49" in one.basis
    assert (three.tokens, three.answer_tokens) == (64, 8) and (eight.tokens, eight.answer_tokens) == (64, 8)  # the minimums
    # the forward parameters: the decoder's linears and norms, and the lm_head (the embedding gather costs nothing)
    assert forward_parameters(MODELS["llama-3.1-8b"]) == pytest.approx(7.50e9, rel=1e-3)
    assert "7.50B forward parameters" in eight.basis
    huge = {**MODELS["llama-3.1-8b"], "num_hidden_layers": 320}
    assert probe_budget(huge)[:2] == (data["min_perplexity_tokens"], data["min_answer_tokens"]) == (64, 8)  # never below the minimums


def test_a_set_budget_is_kept_and_a_config_without_sizes_gets_the_full_one():
    assert probe_budget(MODELS["llama-3.1-8b"], 300)[:2] == (300, 16)
    assert probe_budget({"model_type": "llama"}) == (256, 16, "auto: the config gives no size, the full budget", 1.0)
    assert probe_budget(None).tokens == 256 and probe_budget(MODELS["llama-3.1-8b"]).scale == pytest.approx(0.08, abs=1e-3)


@pytest.mark.parametrize("value", [1, 0, True, "many"])
def test_a_bad_quality_tokens_is_refused_before_any_stage_runs(value):
    with pytest.raises(UsageError, match=r"\[quantize\]\.quality_tokens is .*; expected \"auto\" or an integer of at least 2"):
        preflight(QuantizeConfig(quality_tokens=value), None)  # the target plays no part


def test_the_recipe_parser_admits_auto_or_an_integer():
    from raipack.builder.config import parse_config

    assert parse_config(QuantizeConfig, {"quality_tokens": "auto"}, "[quantize]").quality_tokens == "auto"
    assert parse_config(QuantizeConfig, {"quality_tokens": 64}, "[quantize]").quality_tokens == 64
    with pytest.raises(UsageError, match=r"\[quantize\]\.quality_tokens is 'some'; expected an integer or one of 'auto'"):
        parse_config(QuantizeConfig, {"quality_tokens": "some"}, "[quantize]")


def test_the_export_parity_window_is_auto_by_default_and_refuses_a_bad_one():
    from raipack.runtime.budget import folder_budget
    from raipack.stages.export.stage import ExportConfig, preflight

    assert ExportConfig().parity_tokens == "auto" and ExportConfig().parity_steps == "auto"  # the budget's window and answer length
    preflight(ExportConfig(), {})  # "auto" passes
    with pytest.raises(UsageError, match=r"\[export\]\.parity_steps is 'some'; expected a whole number of at least 1 or \"auto\""):
        preflight(ExportConfig(parity_steps="some"), {})
    with pytest.raises(UsageError, match=r"\[export\]\.parity_tokens is 'many'; expected a whole number of at least 2 or \"auto\""):
        preflight(ExportConfig(parity_tokens="many"), {})
    missing = folder_budget(Path("/nonexistent"))  # an unreadable config.json: the full budget, and the basis says why
    assert missing.tokens == 256 and missing.scale == 1.0 and "no size" in missing.basis


def test_the_smoke_window_is_the_exports(tmp_path):
    """The smoke stage's float (and BFP16) perplexity reads the export's window, as its report gives it, so the figures
    sit side by side; an export whose report does not say gets the full window."""
    import contextlib

    import numpy as np

    from raipack.stages.smoke import device

    def manifest(doc):
        (tmp_path / "manifest.json").write_text(json.dumps(doc))
        return device.export_window(tmp_path)

    assert manifest({"report": {"parity": {"perplexity": {"tokens": 12}}}}) == 12
    for bad in ({}, {"report": {"parity": None}}, {"report": {"parity": {"perplexity": {"tokens": True}}}}, [1]):
        assert manifest(bad) is None, bad
    assert device.export_window(tmp_path / "missing") is None

    class Runtime:
        max_length = 4096

        def prefill(self, ids):
            return np.zeros(50, dtype=np.float32)

        def step(self, token):
            return np.zeros(50, dtype=np.float32)

    class Quiet:
        def task(self, *a, **k):
            return contextlib.nullcontext(lambda n=1: None)

    def tok(text):
        return {"input_ids": [i % 50 for i in range(1000)]}

    report: dict = {}
    assert len(device.float_perplexity(report, Runtime(), tok, Quiet(), 12)) == 12 == report["ppl_window_tokens"]
    assert report["ppl_package"] == pytest.approx(50, rel=1e-4)  # uniform logits over 50 ids
    assert len(device.float_perplexity({}, Runtime(), tok, Quiet(), None)) == 256  # the full window
