"""Quark quantization rules of AMD's Ryzen AI recipe."""

from __future__ import annotations

from raipack.checks.base import check
from raipack.npu.quark_config import layer_weight_spec
from raipack.npu.spec import Quantization

HINT = "re-quantize with Quark: --quant_scheme uint4_wo_128 --quant_algo awq (pack_method reorder, real_quantized export)"


def expected_weight_dtype(rules: Quantization) -> str:
    return f"{'int' if rules.symmetric else 'uint'}{rules.bits}"


@check("RP301", "quant-scheme")
def quant_scheme(ctx):
    """config.json's Quark `quantization_config` follows the Ryzen AI recipe:
    `quant_method` quark; weights `uint4`, `per_group`, the profile's group size
    (128 for AMD's releases), asymmetric; activations not quantized (they run
    as BFP16 on the NPU); export `pack_method` reorder and `weight_format`
    real_quantized; `kv_cache_quant_config` empty; `lm_head` excluded, or given
    its own layer config: uint4 asymmetric per group, with a group size the
    profile lists in `quantization.lm_head_group_sizes` (AMD's packages: 32, as
    older Quark wrote for the hybrid and some NPU packages; a profile without the
    list keeps lm_head float, and a quantized one is a warning). Both the old (algo_config object) and the new (list) Quark shapes
    are read. A package whose config.json is `{}` is accepted where the profile
    allows it."""
    rules = ctx.profile.quantization
    cfg, q = ctx.model_config, ctx.quant_config
    if not isinstance(cfg, dict):
        return
    if q is None:
        if rules.config_json == "quark" and rules.required:
            yield ctx.finding("config.json", f"has no quantization_config; profile {ctx.profile.id} expects the Quark one", HINT, "/quantization_config")
        return
    base = "/quantization_config"

    def bad(pointer, message, hint=HINT, severity=None):
        return ctx.finding("config.json", message, hint, base + pointer, severity)

    if q.get("quant_method") != "quark":
        yield bad("/quant_method", f"quant_method is {q.get('quant_method')!r}; expected 'quark'")
        return
    weight = (q.get("global_quant_config") or {}).get("weight")
    if isinstance(weight, list):  # Quark allows a list of specs (double quantization); the first is the weight's own
        weight = weight[0] if weight else None
    if not isinstance(weight, dict):
        yield bad("/global_quant_config/weight", "global_quant_config.weight is missing; expected a uint4 per-group weight spec")
        return
    yield from _weight(ctx, rules, weight, bad)
    yield from _activations_and_export(q, bad)
    yield from _lm_head(ctx, rules, q, bad)


def _weight(ctx, rules, weight, bad):
    """The global weight spec: dtype, per-group scheme, the profile's group size, symmetry."""
    wp = "/global_quant_config/weight"
    want = expected_weight_dtype(rules)
    if weight.get("dtype") != want:
        yield bad(f"{wp}/dtype", f"weight dtype is {weight.get('dtype')!r}; expected {want!r}")
    if weight.get("qscheme") != "per_group":
        yield bad(f"{wp}/qscheme", f"weight qscheme is {weight.get('qscheme')!r}; expected 'per_group'")
    gs = weight.get("group_size")
    allowed = rules.group_sizes()
    if gs not in allowed:
        yield bad(f"{wp}/group_size", f"weight group_size is {gs!r}; profile {ctx.profile.id} expects {rules.group_size}", "re-quantize with the profile's group size (it must divide every layer's input width)")
    elif gs != rules.group_size:
        yield bad(f"{wp}/group_size", f"weight group_size is {gs}, not the usual {rules.group_size} (accepted by profile {ctx.profile.id})", "expected when the model's widths are not multiples of 128", "warning")
    if weight.get("symmetric") is not rules.symmetric:
        yield bad(f"{wp}/symmetric", f"weight symmetric is {weight.get('symmetric')!r}; expected {str(rules.symmetric).lower()} ({'a' if not rules.symmetric else ''}symmetric, with zero points)")


def _activations_and_export(q, bad):
    """Activations unquantized, the export's pack method and weight format, no KV cache quantization."""
    for tensors in ("input_tensors", "output_tensors"):
        if (q.get("global_quant_config") or {}).get(tensors):
            yield bad(f"/global_quant_config/{tensors}", f"global_quant_config.{tensors} is set; expected null (activations stay unquantized and run as BFP16 on the NPU)")
    export = q.get("export") or {}
    if export.get("pack_method", "reorder") != "reorder":
        yield bad("/export/pack_method", f"export.pack_method is {export.get('pack_method')!r}; expected 'reorder'")
    if export.get("weight_format", "real_quantized") != "real_quantized":
        yield bad("/export/weight_format", f"export.weight_format is {export.get('weight_format')!r}; expected 'real_quantized'")
    if q.get("kv_cache_quant_config"):
        yield bad("/kv_cache_quant_config", "kv_cache_quant_config is not empty; expected {} (the NPU runtime keeps the KV cache unquantized)")


def _lm_head(ctx, rules, q, bad):
    """lm_head excluded, or quantized with its own layer config the profile allows."""
    exclude = q.get("exclude") or []
    layer_cfg = q.get("layer_quant_config") or {}
    if any(e == "lm_head" or e.endswith("lm_head") or e.endswith("*lm_head") for e in exclude if isinstance(e, str)):
        return
    own = [key for key in layer_cfg if "lm_head" in key]
    if not own:
        yield bad("/exclude", "lm_head is neither excluded nor given its own layer_quant_config entry; it is quantized with the global uint4 config", "exclude lm_head (Quark --exclude_layers lm_head) or give it its own group size", "warning")
        return
    pointer = f"/layer_quant_config/{own[0]}/weight"
    spec = layer_weight_spec(q, "lm_head")
    want = expected_weight_dtype(rules)
    if spec is None or spec["dtype"] != want or spec["symmetric"] is not rules.symmetric:
        found = "no weight spec" if spec is None else f"{spec['dtype']} {'symmetric' if spec['symmetric'] else 'asymmetric'}"
        yield bad(pointer, f"lm_head's own layer config is {found}; expected {want} {'symmetric' if rules.symmetric else 'asymmetric'} per group", '[quantize] lm_head = 32 (or "exclude") in the raipack recipe')
        return
    allowed = list(rules.lm_head_group_sizes or ())
    if spec["group_size"] not in allowed:
        where = f"allows lm_head group sizes {allowed}" if allowed else "keeps lm_head float"
        yield bad(f"{pointer}/group_size", f"lm_head is quantized with group_size {spec['group_size']!r}; profile {ctx.profile.id} {where}",
                  '[quantize] lm_head = "exclude" for this release, or a group size it allows', "warning" if not allowed else None)
