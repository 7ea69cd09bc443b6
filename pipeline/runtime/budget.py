"""The token budget of raipack's own checks (issue 41): the quantize stage's probes, the export stage's parity
perplexity and, through the export's report, the smoke stage's perplexity windows. A fixed budget made the
checks a third of the stages at Llama-3.1-8B, so "auto" (each stage's default) keeps the full budget up to a
model size and shrinks the perplexity tokens and the answers' length in proportion to the model's forward cost
above it (pipeline/data/probes.json). Deterministic: the same config gives the same window on every machine, so
the figures compare across builds."""

from __future__ import annotations

from typing import Any, NamedTuple

from raipack.data import load_data
from raipack.npu.dims import parameter_count, text_config


class Budget(NamedTuple):
    tokens: int  # held-out tokens a perplexity scores
    answer_tokens: int  # new tokens of each greedy answer
    basis: str  # how they were chosen, for the record
    scale: float = 1.0  # the share of the full budget (1.0 up to the size in probes.json)


def probes_data() -> dict[str, Any]:
    return load_data("probes.json")


def forward_parameters(config_json: dict[str, Any]) -> int:
    """The parameters one token's forward multiplies by: the decoder's and the lm_head's (tied or not; the embedding's
    gather costs nothing). ValueError when config.json lacks a size."""
    text = text_config(config_json)
    tied = bool(text.get("tie_word_embeddings", config_json.get("tie_word_embeddings", False)))
    return parameter_count(config_json) - (0 if tied else text["vocab_size"] * text["hidden_size"])


def probe_budget(config_json: dict[str, Any] | None, setting: int | str = "auto") -> Budget:
    """The budget for a model: `setting` as set (an int: the perplexity tokens, answers at full length), or scaled from
    its config.json ("auto"; the full budget when there is none or it gives no size)."""
    data = probes_data()
    if setting != "auto":
        return Budget(int(setting), data["answer_tokens"], f"set to {setting} tokens")
    try:
        params = forward_parameters(config_json or {})
    except ValueError:
        return Budget(data["perplexity_tokens"], data["answer_tokens"], "auto: the config gives no size, the full budget")
    scale = min(1.0, data["full_budget_forward_parameters"] / params)
    tokens = max(data["min_perplexity_tokens"], round(data["perplexity_tokens"] * scale))
    answer = max(data["min_answer_tokens"], round(data["answer_tokens"] * scale))
    return Budget(tokens, answer, f"auto: {params / 1e9:.2f}B forward parameters, scale {scale:.2f}", round(scale, 4))


def folder_budget(folder, setting: int | str = "auto") -> Budget:
    """probe_budget for a model folder: its config.json read leniently (unreadable or not an object: the full budget,
    which the Budget's basis says)."""
    import json
    from pathlib import Path

    try:
        doc = json.loads((Path(folder) / "config.json").read_text("utf-8"))
    except (OSError, ValueError):
        doc = None
    return probe_budget(doc if isinstance(doc, dict) else None, setting)
