"""The quality probes' token budget (issue 41): at Llama-3.1-8B a fixed budget made the probes a third of
the RTN stage, so with ``[quantize].quality_tokens = "auto"`` (the default) the perplexity tokens and the
answer's length shrink in proportion to the model's forward cost above a size (data/probes.json)."""

from __future__ import annotations

from typing import Any, NamedTuple

from raipack.data import load_data
from raipack.stages.quantize.memory import Shape


class Budget(NamedTuple):
    tokens: int  # held-out tokens the perplexity probe scores
    answer_tokens: int  # new tokens of each greedy answer
    basis: str  # how they were chosen, for the record


def probes_data() -> dict[str, Any]:
    return load_data("data/probes.json", "raipack.stages.quantize")


def forward_parameters(config_json: dict[str, Any]) -> int:
    """The parameters one token's forward multiplies by: the decoder's and the lm_head's (tied or not); None-safe callers catch ValueError."""
    shape = Shape.from_config(config_json)
    return shape.layers * shape.layer_params() + shape.vocab * shape.hidden


def probe_budget(config_json: dict[str, Any], quality_tokens: int | str = "auto") -> Budget:
    """The budget for a model: `quality_tokens` as set (an int), or scaled from config.json ("auto")."""
    data = probes_data()
    if quality_tokens != "auto":
        return Budget(int(quality_tokens), data["answer_tokens"], f"quality_tokens = {quality_tokens}")
    try:
        params = forward_parameters(config_json)
    except ValueError:
        return Budget(data["perplexity_tokens"], data["answer_tokens"], "auto: the config gives no size, the full budget")
    scale = min(1.0, data["full_budget_forward_parameters"] / params)
    tokens = max(data["min_perplexity_tokens"], round(data["perplexity_tokens"] * scale))
    answer = max(data["min_answer_tokens"], round(data["answer_tokens"] * scale))
    return Budget(tokens, answer, f"auto: {params / 1e9:.2f}B forward parameters, scale {scale:.2f}")
