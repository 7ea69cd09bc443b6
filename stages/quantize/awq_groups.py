"""AWQ's scaling groups: which Quark uses for a model type, and which it actually applied.

Quark 0.13 ships an LLMTemplate per model type and, for most of them, an AWQ config (its scaling
groups: prev_op -> the linears whose inputs it scales). Where it lacks one (qwen3), raipack gives
it the groups from ``data/awq.json`` (data, never code from the model folder). While AWQ runs,
``record_scaling()`` notes every group Quark scaled in every decoder layer; Quark itself drops a
group silently when its names match nothing, and only logs a warning when a linear -> linear pair
cannot be scaled, so ``summarize()`` counts what really happened and the stage refuses a model
for which AWQ scaled nothing (that would be round-to-nearest under AWQ's name).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from raipack.core.errors import RaipackError
from raipack.data import load_data
from raipack.stages.quantize.preflight import HINT
from raipack.stages.quark_import import import_quark


def awq_data() -> dict[str, Any]:
    return load_data("data/awq.json", "raipack.stages.quantize")


def template(model_type: str | None, where: str) -> Any:
    """Quark's LLMTemplate for ``model_type``; registered from data/awq.json when Quark has none."""
    import_quark()  # never hangs on a killed build's compile lock, and skips most of Quark's import scan
    from quark.torch import LLMTemplate

    if model_type not in LLMTemplate.list_available():
        fields = awq_data()["templates"].get(model_type or "")
        if fields is None:
            raise RaipackError(f"{where}: Quark 0.13 has no template for model_type {model_type!r}; "
                               f"supported: {', '.join(sorted(LLMTemplate.list_available()))}", HINT)
        LLMTemplate.register_template(LLMTemplate(model_type=model_type, **fields))
    return LLMTemplate.get(model_type)


def awq_config(model_type: str | None) -> tuple[Any, str]:
    """(the AWQ config to pass to Quark, or None for Quark's own; where the groups come from)."""
    import_quark()
    from quark.torch.quantization.config.algo_configs import get_algo_config

    if get_algo_config("awq", model_type or "") is not None:
        return None, "quark"
    fields = awq_data()["configs"].get(model_type or "")
    if fields is None:
        return None, "none"
    from quark.torch.quantization.config.config import AWQConfig

    return AWQConfig(**fields), "raipack (stages/quantize/data/awq.json)"


def configured_groups(model_type: str | None, config: Any) -> list[dict[str, Any]]:
    """The scaling groups AWQ will try, as plain dicts (prev_op, layers)."""
    if config is None:
        from quark.torch.quantization.config.algo_configs import get_algo_config

        config = get_algo_config("awq", model_type or "")
    return [{"prev_op": g["prev_op"], "layers": list(g["layers"])} for g in (getattr(config, "scaling_layers", None) or [])]


@contextmanager
def record_scaling() -> Iterator[list[tuple[str, tuple[str, ...], bool]]]:
    """Within the block, every (prev_op, layers, applied) AWQ scaled, one entry per decoder layer and group.

    Wraps the names Quark's AWQ calls (``apply_scale`` in its awq module, ``scale_fc_fc`` in its scale
    module): a pair ``scale_fc_fc`` cannot scale raises there, which Quark turns into a log line.
    """
    import quark.torch.algorithm.awq.awq as awq_module
    import quark.torch.algorithm.awq.scale as scale_module

    seen: list[tuple[str, tuple[str, ...], bool]] = []
    failed: list[bool] = []
    original_apply, original_fc_fc = awq_module.apply_scale, scale_module.scale_fc_fc

    def fc_fc(*args: Any, **kwargs: Any) -> Any:
        try:
            return original_fc_fc(*args, **kwargs)
        except RuntimeError:
            failed.append(True)
            raise

    def apply(module: Any, scales_list: list[Any], *args: Any, **kwargs: Any) -> Any:
        for entry in scales_list:  # one at a time: Quark's loop treats each entry on its own
            before = len(failed)
            original_apply(module, [entry], *args, **kwargs)
            seen.append((entry[0], tuple(entry[1]), len(failed) == before))

    awq_module.apply_scale, scale_module.scale_fc_fc = apply, fc_fc
    try:
        yield seen
    finally:
        awq_module.apply_scale, scale_module.scale_fc_fc = original_apply, original_fc_fc


def summarize(configured: list[dict[str, Any]], seen: list[tuple[str, tuple[str, ...], bool]], decoder_layers: int | None,
              source: str) -> dict[str, Any]:
    """The report's ``awq`` record: per configured group, in how many decoder layers AWQ scaled it."""
    known = [(g["prev_op"], tuple(g["layers"])) for g in configured]
    extra = sorted({(p, ls) for p, ls, _ in seen} - set(known))  # defensive: groups Quark found itself
    groups = []
    for prev, layers in known + extra:
        hits = [ok for p, ls, ok in seen if (p, ls) == (prev, layers)]
        groups.append({"prev_op": prev, "layers": list(layers), "decoder_layers_scaled": sum(hits), "decoder_layers_failed": len(hits) - sum(hits)})
    return {"source": source, "decoder_layers": decoder_layers, "scaling_groups": groups,
            "linears_scaled": sum(len(g["layers"]) * g["decoder_layers_scaled"] for g in groups)}


def check_applied(record: dict[str, Any], model_type: str | None, where: str) -> list[str]:
    """Warnings for groups AWQ skipped in some layers; RaipackError when it scaled nothing at all."""
    if not record["linears_scaled"]:
        names = "; ".join(f"{g['prev_op']} -> {', '.join(g['layers'])}" for g in record["scaling_groups"]) or "none configured"
        raise RaipackError(f"{where}: AWQ scaled no layer of this {model_type} model (scaling groups: {names}), which would be round-to-nearest under AWQ's name",
                           'add the model type\'s scaling groups to stages/quantize/data/awq.json, or quantize with algorithm = "rtn" knowingly')
    n = record["decoder_layers"]
    return [f"AWQ scaled {g['prev_op']} -> {', '.join(g['layers'])} in {g['decoder_layers_scaled']} of {n} decoder layers"
            for g in record["scaling_groups"] if n and g["decoder_layers_scaled"] < n]
