"""Everything cheap, checked before anything heavy runs: the folder holds safetensors (pickle
checkpoints are refused) and the group size divides the input width of every linear layer that
will be quantized (Quark does not pad; it fails with a bare ``AssertionError`` deep inside AWQ
otherwise). Shapes come from config.json, or from a meta-device model for unknown layouts."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from raipack.core.errors import RaipackError
from raipack.npu import families
from raipack.npu.dims import text_config

GroupSize = int | Literal["auto"]
LmHead = int | Literal["exclude"]
GROUP_SIZES = (128, 64, 32)  # the uint4_wo_<g> schemes Quark ships, preferred first
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")

HINT = "fix the recipe's [quantize] options or the input model"


class GroupSizeError(RaipackError):
    """The group size does not divide the input width of some layers (carries them, for the "auto" choice and the tests)."""

    def __init__(self, message: str, group_size: int, offenders: list[tuple[str, int]]):
        super().__init__(message, HINT)
        self.group_size = group_size
        self.offenders = offenders


def read_config(model_config_or_dir: Any) -> dict[str, Any]:
    if isinstance(model_config_or_dir, Mapping):
        return dict(model_config_or_dir)
    if hasattr(model_config_or_dir, "to_dict"):  # transformers PretrainedConfig
        return model_config_or_dir.to_dict()
    path = Path(model_config_or_dir)
    if path.is_dir():
        path = path / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RaipackError(f"{path}: not found; expected a Hugging Face model folder with config.json", HINT) from None
    except json.JSONDecodeError as exc:
        raise RaipackError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}", HINT) from None


def linear_shapes(cfg: dict[str, Any]) -> list[tuple[str, int, int]] | None:
    """``(name, in_features, out_features)`` of every linear layer, from config.json alone.

    Known for the families whose `linears` layout (pipeline/data/architectures.json) is "llama"
    (q/k/v/o + gate/up/down) or "phi3" (fused qkv_proj, gate_up_proj); ``None`` for others.
    """
    c = text_config(cfg)
    model_type = c.get("model_type") or cfg.get("model_type")
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers")
    if any(not isinstance(c.get(k), int) for k in keys):
        return None
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    heads, layers = c["num_attention_heads"], c["num_hidden_layers"]
    kv = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or hidden // heads
    vocab = c.get("vocab_size") or 0
    layout = families.linears_of(model_type)
    if layout == "llama":
        per_layer = [
            ("self_attn.q_proj", hidden, heads * head_dim),
            ("self_attn.k_proj", hidden, kv * head_dim),
            ("self_attn.v_proj", hidden, kv * head_dim),
            ("self_attn.o_proj", heads * head_dim, hidden),
            ("mlp.gate_proj", hidden, inter),
            ("mlp.up_proj", hidden, inter),
            ("mlp.down_proj", inter, hidden),
        ]
    elif layout == "phi3":
        per_layer = [
            ("self_attn.qkv_proj", hidden, (heads + 2 * kv) * head_dim),
            ("self_attn.o_proj", heads * head_dim, hidden),
            ("mlp.gate_up_proj", hidden, 2 * inter),
            ("mlp.down_proj", inter, hidden),
        ]
    else:
        return None
    shapes = [(f"model.layers.{i}.{n}", fi, fo) for i in range(layers) for n, fi, fo in per_layer]
    shapes.append(("lm_head", hidden, vocab))
    return shapes


def _linear_shapes_from_meta_model(cfg: dict[str, Any]) -> list[tuple[str, int, int]]:
    """Fallback for other architectures: build the model on the meta device (no weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    return [
        (name, m.in_features, m.out_features) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)
    ]


def _is_excluded(name: str, exclude: Iterable[str]) -> bool:
    # the same rule as Quark's: exact module name or fnmatch pattern
    return any(name == p or fnmatch.fnmatch(name, p) for p in exclude)


def check_group_size(
    model_config_or_dir: Any, group_size: int, exclude: Iterable[str] = ("lm_head",)
) -> list[tuple[str, int]]:
    """Layers whose ``in_features`` the group size does not divide, as ``(name, in_features)``.

    Takes a model folder, a config.json path, a config dict or a transformers config.
    Computed from config.json for the common decoder shapes; other architectures are
    built on the meta device (no weights loaded). An empty list means the size works.
    """
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise RaipackError(f"group size must be a positive integer, got {group_size!r}", HINT)
    cfg = read_config(model_config_or_dir)
    shapes = linear_shapes(cfg)
    if shapes is None:
        shapes = _linear_shapes_from_meta_model(cfg)
    exclude = tuple(exclude)
    return [(name, fi) for name, fi, _ in shapes if not _is_excluded(name, exclude) and fi % group_size]


def _summarize(offenders: Sequence[tuple[str, int]], limit: int = 6) -> str:
    """'mlp.down_proj (in 1536) in 30 layers, ...' instead of one entry per decoder layer."""
    groups: dict[tuple[str, int], list[str]] = {}
    for name, width in offenders:
        parts = name.split(".")
        key = ".".join(parts[3:]) if len(parts) > 3 and parts[2].isdigit() else name
        groups.setdefault((key, width), []).append(name)
    items = []
    for (key, width), names in groups.items():
        where = names[0] if len(names) == 1 else f"{key} in {len(names)} layers"
        items.append(f"{where} (in_features {width})")
    more = f", and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def resolve_group_size(
    model_config_or_dir: Any, group_size: GroupSize, exclude: Iterable[str] = ("lm_head",)
) -> tuple[int, str | None]:
    """The group size to use and a warning (or ``None``); raises ``GroupSizeError``.

    ``"auto"`` picks the largest of 128/64/32 that divides every quantized layer's width.
    """
    exclude = tuple(exclude)
    if group_size == "auto":
        for g in GROUP_SIZES:
            if not check_group_size(model_config_or_dir, g, exclude):
                if g == GROUP_SIZES[0]:
                    return g, None
                offenders = check_group_size(model_config_or_dir, GROUP_SIZES[0], exclude)
                return g, (
                    f"group size {GROUP_SIZES[0]} does not divide {_summarize(offenders)}; "
                    f"using group size {g} (AMD's recipes use {GROUP_SIZES[0]})"
                )
        offenders = check_group_size(model_config_or_dir, GROUP_SIZES[-1], exclude)
        raise GroupSizeError(
            f"no supported group size ({', '.join(map(str, GROUP_SIZES))}) divides the input width of "
            f"{_summarize(offenders)}; exclude those layers or use another model",
            GROUP_SIZES[-1],
            offenders,
        )
    if group_size not in GROUP_SIZES:
        raise RaipackError(
            f"group size {group_size!r} is not supported; expected one of {', '.join(map(str, GROUP_SIZES))} or 'auto'", HINT
        )
    offenders = check_group_size(model_config_or_dir, group_size, exclude)
    if offenders:
        working = [g for g in GROUP_SIZES if not check_group_size(model_config_or_dir, g, exclude)]
        hint = f"use group size {working[0]} (or 'auto')" if working else "exclude those layers"
        raise GroupSizeError(
            f"group size {group_size} does not divide the input width of {_summarize(offenders)}; {hint}",
            group_size,
            offenders,
        )
    return group_size, None


def check_source_dir(src_dir: Path) -> list[str]:
    """Refuse folders without safetensors weights; returns warnings (e.g. ignored pickles)."""
    src_dir = Path(src_dir)
    if not (src_dir / "config.json").is_file():
        raise RaipackError(f"{src_dir}: no config.json; expected a Hugging Face model folder", HINT)
    pickles = sorted(p.name for p in src_dir.iterdir() if p.is_file() and p.suffix in PICKLE_SUFFIXES)
    safetensors = sorted(p.name for p in src_dir.glob("*.safetensors"))
    if not safetensors:
        if pickles:
            raise RaipackError(
                f"{src_dir}: only pickle checkpoints ({', '.join(pickles)}); raipack loads safetensors only, "
                "because unpickling runs arbitrary code. Convert them first, e.g. "
                "AutoModelForCausalLM.from_pretrained(dir).save_pretrained(new_dir, safe_serialization=True) "
                "in a sandbox you trust", HINT
            )
        raise RaipackError(f"{src_dir}: no *.safetensors weights found", HINT)
    if pickles:
        return [f"ignoring pickle files in {src_dir}: {', '.join(pickles)} (safetensors are used)"]
    return []


# [quantize].dtype = "auto": the dtype the model is held and quantized in, from the source's config.json
# (AMD's Ryzen AI checkpoints are quantized from bfloat16: "-bf16-" in their names, "BF16 activations" in
# their cards). A bfloat16 source stays bfloat16 (half a float32 copy's memory; Quark's CPU examples run
# AWQ with --data_type bfloat16); float16 becomes bfloat16 on the CPU (same 2 bytes, a wider range, CPU
# kernels for it) and stays float16 on a GPU; float32 or an unnamed dtype is float32.
AUTO_DTYPE = {("bfloat16", "cpu"): "bfloat16", ("bfloat16", "cuda"): "bfloat16", ("float16", "cpu"): "bfloat16", ("float16", "cuda"): "float16"}


def resolve_dtype(dtype: str, model_config_or_dir: Any, device: str = "cpu") -> str:
    """The dtype the quantize stage holds the model in: ``dtype`` itself, or for ``"auto"`` the source's
    (config.json's ``torch_dtype``/``dtype``, AUTO_DTYPE), float32 when it names none."""
    if dtype != "auto":
        return dtype
    cfg = read_config(model_config_or_dir)
    text = text_config(cfg)
    source = cfg.get("torch_dtype") or cfg.get("dtype") or text.get("torch_dtype") or text.get("dtype")
    return AUTO_DTYPE.get((str(source), device), "float32")


def resolve_lm_head(model_config_or_dir: Any, lm_head: Any, where: str = "config.json") -> LmHead:
    """``"exclude"`` or the group size lm_head is quantized with; one sentence when it cannot be.

    The group must be one of 128/64/32 and divide lm_head's input width (the hidden size)."""
    if lm_head == "exclude":
        return "exclude"
    if isinstance(lm_head, bool) or lm_head not in GROUP_SIZES:
        raise RaipackError(f"[quantize].lm_head is {lm_head!r}; expected \"exclude\" or one of {', '.join(map(str, GROUP_SIZES))}",
                           'set lm_head = "exclude" (AMD\'s NPU recipe) or lm_head = 32 (AMD\'s hybrid checkpoints)')
    hidden = text_config(read_config(model_config_or_dir)).get("hidden_size")
    if isinstance(hidden, int) and hidden % lm_head:
        working = [g for g in GROUP_SIZES if hidden % g == 0]
        raise RaipackError(f"{where}: lm_head's input width (hidden_size {hidden}) is not a multiple of [quantize].lm_head = {lm_head}",
                           f"use lm_head = {working[0]}" if working else 'use lm_head = "exclude"')
    return lm_head
