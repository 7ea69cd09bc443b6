"""The quantize stage's probe budget (issue 41): the full 256 tokens and 16-token answers up to 2B forward
parameters, fewer in proportion above; an explicit quality_tokens is kept; a bad one is refused before any stage runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raipack.core.errors import UsageError
from raipack.stages.quantize.budget import forward_parameters, probe_budget, probes_data
from raipack.stages.quantize.stage import QuantizeConfig, preflight

MODELS = json.loads((Path(__file__).resolve().parents[2] / "bench" / "real_models.json").read_text())


def test_the_budget_shrinks_with_the_models_forward_cost():
    data = probes_data()
    one, three, eight = (probe_budget(MODELS[m]) for m in ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b"))
    assert (one.tokens, one.answer_tokens) == (data["perplexity_tokens"], data["answer_tokens"]) == (256, 16)
    assert (three.tokens, three.answer_tokens) == (159, 10) and (eight.tokens, eight.answer_tokens) == (68, 8)
    # the forward parameters: the decoder's linears and norms, and the lm_head (the embedding gather costs nothing)
    assert forward_parameters(MODELS["llama-3.1-8b"]) == pytest.approx(7.50e9, rel=1e-3)
    assert "7.50B forward parameters" in eight.basis
    huge = {**MODELS["llama-3.1-8b"], "num_hidden_layers": 320}
    assert probe_budget(huge)[:2] == (data["min_perplexity_tokens"], data["min_answer_tokens"]) == (64, 8)  # never below the minimums


def test_a_set_budget_is_kept_and_a_config_without_sizes_gets_the_full_one():
    assert probe_budget(MODELS["llama-3.1-8b"], 300)[:2] == (300, 16)
    assert probe_budget({"model_type": "llama"}) == (256, 16, "auto: the config gives no size, the full budget")


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
