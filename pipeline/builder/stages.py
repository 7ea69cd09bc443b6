"""The build's stages: found by name from pipeline/data/stages.json, known to the runner by kind.

Each module named there defines STAGE (pipeline/core/stage.py: the Stage/Job contract). The runner
never names a stage: it asks for the stage of a kind — the one a user's model folder stands in for,
the one whose output becomes the package.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from raipack.core.errors import UsageError
from raipack.core.memory import gib
from raipack.core.stage import MemoryEstimate, Stage
from raipack.data import load_data
from raipack.npu.dims import kv_width, parameter_count, text_config
from raipack.npu.spec import Profile

MODEL_KIND = "source"  # a user's model folder replaces the output of the stage of this kind
PACKAGE_KIND = "package"  # the output of the stage of this kind is assembled into the package


def order() -> list[str]:
    return list(load_data("stages.json")["order"])


def get(name: str) -> Stage:
    modules = load_data("stages.json")["modules"]
    if name not in modules:
        raise UsageError(f"no stage named {name!r}", f"stages are: {', '.join(order())}")
    return importlib.import_module(modules[name]).STAGE


def of_kind(kind: str) -> str:
    """The name of the one stage that declares `kind`."""
    names = [name for name in order() if get(name).kind == kind]
    if len(names) != 1:
        raise RuntimeError(f"pipeline/data/stages.json: {len(names)} stages of kind {kind!r}, expected one")
    return names[0]


def memory(name: str, config: Any, folders: list[Path], profile: Profile) -> MemoryEstimate:
    """Stage `name`'s peak memory, estimated before it loads anything: its own `memory` from the first
    config.json among `folders` (its inputs, the user's model folder), else the allowance rule of
    pipeline/data/stage_memory.json (also when its own estimate does not know the architecture)."""
    model_config = model_config_of(folders)
    own = get(name).memory
    if own is not None:
        try:
            return own(config, model_config, profile)
        except (ValueError, TypeError, KeyError, AttributeError):  # an architecture its model does not know: the allowance
            pass
    return allowance(name, model_config, profile)


def allowance(name: str, model_config: dict | None, profile: Profile) -> MemoryEstimate:
    data = load_data("stage_memory.json")
    rule = data["rules"].get(name, data["default"])
    try:
        params = parameter_count(model_config) if model_config is not None else 0
    except ValueError:
        params = 0
    text = text_config(model_config) if params else {}
    vocab = text.get("vocab_size") if isinstance(text.get("vocab_size"), int) else 0
    hidden = text.get("hidden_size") if isinstance(text.get("hidden_size"), int) else 0
    tied = bool(text.get("tie_word_embeddings", (model_config or {}).get("tie_word_embeddings", False)))
    tier = max(profile.buckets.prefill or (0,))
    # float32 bytes: the embedding table(s) (one when tied; the export keeps them float) and the rest
    tables = 4 * vocab * hidden * (1 if tied else 2) if "per_table_byte" in rule else 0
    weights, logits = 4 * params - tables, 4 * vocab * tier
    # float32 keys and values of every layer at the profile's longest KV length (the runtime's static buffer)
    kv = 4 * 2 * kv_width(model_config) * max(profile.buckets.token or profile.buckets.prefill or (0,)) if "per_kv_byte" in rule else 0
    total = int(rule["base"] + rule.get("per_weight_byte", 0) * weights + rule.get("per_table_byte", 0) * tables
                + rule.get("per_logit_byte", 0) * logits + rule.get("per_kv_byte", 0) * kv)
    basis = f"raipack's allowance for {params / 1e9:.3f}B parameters" if params else "raipack's allowance before the model's config.json is known"
    if logits and rule.get("per_logit_byte"):
        basis += f", prefill logits {gib(logits)} at {tier} tokens"
    if kv:
        basis += f", KV cache {gib(kv)}"
    return MemoryEstimate(total, basis, details={"rule": rule, "parameters": params})


def model_config_of(folders: list[Path]) -> dict | None:
    """The first config.json object among `folders`, or None."""
    for folder in folders:
        try:
            doc = json.loads((Path(folder) / "config.json").read_text("utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict):
            return doc
    return None
