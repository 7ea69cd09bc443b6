"""The model families raipack builds: one table keyed by config.json's model_type
(`raipack/data/architectures.json` `families`), read by the input check, quantize, export and fuse."""

from __future__ import annotations

from raipack.data import load_data


def families() -> dict[str, dict]:
    return load_data("architectures.json")["families"]


def supported() -> dict[str, str]:
    """Hugging Face architecture class → notes, in the table's order."""
    return {f["architecture"]: f["notes"] for f in families().values()}


def linears_of(model_type: str | None) -> str | None:
    """The layout name of the family's linear layers ("llama": q/k/v/o + gate/up/down, "phi3": fused)."""
    return (families().get(model_type or "") or {}).get("linears")


def qkv_bias(model_type: str | None) -> bool:
    """The family's q/k/v projections carry biases whatever config.json says (Qwen2: no attention_bias key)."""
    return bool((families().get(model_type or "") or {}).get("qkv_bias"))


def export_options(model_type: str | None) -> dict[str, str]:
    """The OGA builder's extra options the family needs (the caller's own win)."""
    return dict((families().get(model_type or "") or {}).get("export_options") or {})


def fuse_matchers() -> list[str]:
    """Modules of stages/fuse/graph/ holding a family's own layer matcher, in the table's order."""
    return list(dict.fromkeys(f["fuse_matcher"] for f in families().values() if f.get("fuse_matcher")))
