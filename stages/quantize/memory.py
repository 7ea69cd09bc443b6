"""How much memory the quantize stage needs, from config.json alone, and whether it fits.

``estimate()`` adds up the model's weights in the chosen dtype, what Quark keeps while it
processes one decoder layer with the calibration batches (cached layer inputs, the inputs
of every linear, a copy of the layer's weights, and the largest of one forward over all samples,
AWQ's clipping search and its scale search), the export at the end and a fixed runtime overhead. The constants live
in ``data/memory.json``; the derivation and the measurements behind them are in
docs/measurements/quantize.md (section "Memory").

``stage_estimate()`` is the stage's estimate as the stage registry reports it (the build runner
refuses the stage, before any weight is loaded, when it exceeds what ``raipack.core.memory.available()``
reports, with the numbers and a calibration that would fit); ``check()`` is the same test outside a
build. ``RAIPACK_MEMORY_LIMIT`` replaces the measured available memory (raipack.core.memory).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from raipack.core.errors import RaipackError
from raipack.core.memory import ENV_LIMIT, GIB, MIB, available, gib, parse_size  # noqa: F401  (ENV_LIMIT, GIB, parse_size: this module's names before they moved)
from raipack.core.stage import MemoryEstimate
from raipack.data import load_data
from raipack.npu import families
from raipack.stages.quantize.awq_clip import rows_per_call, sampled_tokens
from raipack.stages.quantize.preflight import text_config


def model_data() -> dict[str, Any]:
    """The constants of the memory model (``stages/quantize/data/memory.json``)."""
    return load_data("data/memory.json", "raipack.stages.quantize")


# --------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qkv_bias: bool
    fused: bool

    @classmethod
    def from_config(cls, config_json: dict[str, Any]) -> Shape:
        c = text_config(config_json)
        model_type = c.get("model_type") or config_json.get("model_type")
        missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
                   if not isinstance(c.get(k), int)]
        if missing:
            raise ValueError(f"config.json has no integer {', '.join(missing)}")
        heads = c["num_attention_heads"]
        return cls(
            hidden=c["hidden_size"], intermediate=c["intermediate_size"], layers=c["num_hidden_layers"], heads=heads,
            kv_heads=c.get("num_key_value_heads") or heads, head_dim=c.get("head_dim") or c["hidden_size"] // heads,
            vocab=c["vocab_size"], tied=bool(c.get("tie_word_embeddings", config_json.get("tie_word_embeddings", False))),
            qkv_bias=families.qkv_bias(model_type) or bool(c.get("attention_bias")),
            fused=families.linears_of(model_type) == "phi3",  # qkv_proj and gate_up_proj: same parameter count, other linear shapes
        )

    def linears(self) -> list[tuple[str, int, int]]:
        """``(name, in_features, out_features)`` of one decoder layer's linears."""
        h, i, q, kv = self.hidden, self.intermediate, self.heads * self.head_dim, self.kv_heads * self.head_dim
        if self.fused:
            return [("qkv_proj", h, q + 2 * kv), ("o_proj", q, h), ("gate_up_proj", h, 2 * i), ("down_proj", i, h)]
        return [("q_proj", h, q), ("k_proj", h, kv), ("v_proj", h, kv), ("o_proj", q, h),
                ("gate_proj", h, i), ("up_proj", h, i), ("down_proj", i, h)]

    def layer_params(self) -> int:
        bias = (self.heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        return sum(fi * fo for _, fi, fo in self.linears()) + bias + 2 * self.hidden  # + two RMSNorms

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)  # embed_tokens (+ untied lm_head)

    def params(self) -> int:
        return self.layers * self.layer_params() + self.embedding_params() + self.hidden  # + final norm


# --------------------------------------------------------------------------- the estimate


@dataclass(frozen=True)
class Estimate:
    """Bytes the quantize stage needs; ``total`` is what ``check()`` compares."""

    params: int
    dtype: str
    device: str
    algorithm: str
    num_samples: int
    seq_len: int
    weights: int
    activations: int
    export: int
    quantized_copy: int
    loading: int
    overhead: int
    safety_factor: float
    total: int
    terms: dict[str, int] = field(default_factory=dict)  # the activation terms, before max()

    def breakdown(self) -> dict[str, int]:
        return {"weights": self.weights, "activations": self.activations, "export": self.export,
                "quantized_copy": self.quantized_copy, "loading": self.loading, "overhead": self.overhead, "total": self.total}

    def lines(self) -> list[str]:
        calib = "no calibration" if self.algorithm == "rtn" else f"{self.num_samples} x {self.seq_len} tokens"
        out = [
            f"{self.params / 1e9:.3f}B parameters, {self.algorithm} in {self.dtype} on {self.device}, {calib}",
            f"  weights      {gib(self.weights)}",
            f"  activations  {gib(self.activations)}"
            + "".join(f"\n    {k:<14} {gib(v)}" for k, v in self.terms.items() if v),
            f"  quantized    {gib(self.quantized_copy)} (copies of the linears the algorithm holds until the export)",
            f"  export       {gib(self.export)}",
            f"  loading      {gib(self.loading)} (conversion from the file's dtype)",
            f"  overhead     {gib(self.overhead)}",
            f"  total        {gib(self.total)} = weights + max(loading, quantized + max(activations x {self.safety_factor}, export))"
            " + overhead",
        ]
        return "\n".join(out).split("\n")


def estimate(config_json: dict, *, dtype: str, device: str, num_samples: int, seq_len: int, algorithm: str) -> Estimate:
    """The memory the quantize stage needs for the model described by ``config_json``.

    The dtype of the safetensors on disk is config.json's ``torch_dtype``/``dtype`` (else ``dtype``):
    loading converts, and holds the file's pages meanwhile, when it differs from ``dtype``.
    """
    data = model_data()
    if dtype not in data["bytes_per_dtype"]:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(data['bytes_per_dtype'])}")
    b = data["bytes_per_dtype"][dtype]
    s = Shape.from_config(config_json)
    params = s.params()
    weights = params * b
    n, L = num_samples, seq_len
    t = n * L
    cal = data["calibration"]
    terms: dict[str, int] = {}
    algorithm = algorithm.lower()
    layer_weights = cal["layer_weight_copies"] * s.layer_params() * b
    if algorithm in ("awq", "gptq"):
        terms["layer_inputs"] = cal["layer_input_copies"] * t * s.hidden * b
        forward = (cal["attention_score_copies"] * n * s.heads * L * L + cal["mlp_intermediate_copies"] * t * s.intermediate
                   + cal["layer_output_copies"] * t * s.hidden) * b
        if algorithm == "awq":
            terms["linear_inputs"] = t * sum(fi for _, fi, _ in s.linears()) * b
            clip = data["awq_clip"]
            sampled = sampled_tokens(t, clip["sample_tokens"])
            search = max((rows_per_call(fo, fi, sampled, b, clip) * sampled * fi * b for name, fi, fo in s.linears() if name not in clip["skip"]), default=0)
            terms["clip_search"] = search
            scale = data["awq_scale_search"]
            sizes = {name: fi * fo for name, fi, fo in s.linears()}
            terms["scale_search"] = scale["copies"] * scale["bytes"] * max(sum(sizes.get(n, 0) for n in group) for group in scale["groups"])
        else:
            g = data["gptq"]
            terms["hessians"] = sum(fi * fi for _, fi, _ in s.linears()) * g["hessian_bytes"]
            search = g["weight_work_copies"] * max(fi * fo for _, fi, fo in s.linears()) * g["weight_work_bytes"]
            terms["gptq_work"] = search
        terms["layer_forward"] = forward
        terms["layer_weights"] = layer_weights
        # the layer's forward and the searches never run at the same time
        exclusive = [forward, search, terms.get("scale_search", 0)]
        activations = sum(terms.values()) - sum(exclusive) + max(exclusive)
    else:  # rtn: one layer's temporaries only
        terms["layer_weights"] = layer_weights
        activations = layer_weights
    ex = data["export"]
    quantized = s.layers * sum(fi * fo for _, fi, fo in s.linears())
    export = int(ex["copies"] * ((params - quantized) * b + quantized * ex["packed_bytes_per_weight"]
                                 + quantized / ex["group_size"] * (b + ex["zero_point_bytes_per_group"])))
    source_dtype = config_json.get("torch_dtype") or config_json.get("dtype") or dtype
    source_b = data["bytes_per_dtype"].get(source_dtype, b)
    loading = 0 if source_dtype == dtype else int(data["load"]["converted_file_fraction"] * params * source_b)
    copy = int(data["quantized_copy"]["copies"][algorithm] * quantized * b)
    # loading (file pages next to the new tensors) comes first; the fake-quantized copy grows
    # layer by layer during calibration and is complete for the export
    # The weights are the file's size, exactly; the factor covers what the tuned allocator's heap adds to the
    # calibration's temporaries (the export runs after that tuning ends: runtime.release_memory).
    factor = data["safety_factor"]["value"]
    model_dependent = weights + max(loading, copy + max(math.ceil(factor * activations), export))
    overhead_mib = data["overhead_mib"]["cpu"] + (data["overhead_mib"]["cuda_context"] if device == "cuda" else 0)
    overhead = overhead_mib * MIB
    total = model_dependent + overhead
    return Estimate(params=params, dtype=dtype, device=device, algorithm=algorithm, num_samples=n, seq_len=L,
                    weights=weights, activations=activations, export=export, quantized_copy=copy, loading=loading, overhead=overhead,
                    safety_factor=factor, total=total, terms=terms)


# --------------------------------------------------------------------------- what the machine has


# --------------------------------------------------------------------------- the check


def _fits(config_json: dict, avail: int, **kw: Any) -> tuple[int, int, Estimate] | None:
    """The largest calibration (most tokens, then longest windows) whose estimate fits in ``avail``."""
    best = None
    seq_len = kw.pop("seq_len")
    requested = kw.pop("num_samples")
    while seq_len >= 16:
        for n in range(requested, 0, -1):
            e = estimate(config_json, num_samples=n, seq_len=seq_len, **kw)
            if e.total <= avail:
                if best is None or n * seq_len > best[0] * best[1]:
                    best = (n, seq_len, e)
                break
        seq_len //= 2
    return best


def stage_estimate(cfg: dict, *, dtype: str, device: str, num_samples: int, seq_len: int, algorithm: str) -> MemoryEstimate:
    """The estimate as the stage registry reports it: bytes, what they count, and the cheaper calibration as the hint."""
    est = estimate(cfg, dtype=dtype, device=device, num_samples=num_samples, seq_len=seq_len, algorithm=algorithm)
    parts = f"weights {gib(est.weights)} in {dtype}"
    if est.algorithm != "rtn":
        parts += f", calibration activations {gib(est.activations)} for {num_samples} x {seq_len} tokens"
    parts += f", export {gib(est.export)}"
    if est.loading:
        parts += f", loading {gib(est.loading)}"
    kw = {"dtype": dtype, "device": device, "algorithm": algorithm, "num_samples": num_samples, "seq_len": seq_len}
    return MemoryEstimate(est.total, f"{parts}, runtime {gib(est.overhead)}", device, partial(_hint, cfg, est, kw),
                          {"breakdown": est.breakdown(), "activation_terms": dict(est.terms)})


def _hint(cfg: dict, est: Estimate, kw: dict, avail: int) -> str:
    """A calibration, or a dtype, whose estimate fits in ``avail``."""
    gpu = 'use a GPU ([quantize] device = "cuda" in a --recipe) if you have one'
    smaller = _fits(cfg, avail, **kw) if est.algorithm != "rtn" else None
    if smaller is not None:
        n, m, e = smaller
        return f"{gpu}, or a smaller calibration: --num-samples {n} --seq-len {m} (which would need {gib(e.total)})"
    alt = ""
    if kw["dtype"] == "float32":
        lighter = _fits(cfg, avail, **dict(kw, dtype="bfloat16"))
        if lighter is not None:
            n, m, e = lighter
            calib = "" if est.algorithm == "rtn" else f" with --num-samples {n} --seq-len {m}"
            alt = f'; [quantize] dtype = "bfloat16"{calib} would need {gib(e.total)}'
    return (f"even the weights with the smallest calibration do not fit in {gib(avail)}: {gpu}, "
            f"or quantize on a machine with at least {gib(est.total)} free{alt}")


def check(model_dir: Path, *, dtype: str, device: str, num_samples: int, seq_len: int, algorithm: str) -> dict[str, Any]:
    """Refuse (``RaipackError``) when the estimate for ``model_dir`` exceeds the available memory.

    Returns the stage report's ``memory`` record. A config.json whose sizes are unknown
    (another architecture) is not estimated: the record says why and the stage goes on.
    (A build checks through the registry instead: pipeline/builder/stages.py: memory.)
    """
    model_dir = Path(model_dir)
    try:
        cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        est = stage_estimate(cfg, dtype=dtype, device=device, num_samples=num_samples, seq_len=seq_len, algorithm=algorithm)
    except (OSError, ValueError, TypeError) as exc:  # the stage's own checks report a bad folder
        return {"estimate_bytes": None, "skipped": str(exc)}
    avail, source = available(device)
    record = {"estimate_bytes": est.bytes, **est.details, "available_bytes": avail, "available_source": source}
    if avail is None or est.bytes <= avail:
        return record
    message = (f"{model_dir}: quantizing needs about {gib(est.bytes)} of memory ({est.basis}) "
               f"but only {gib(avail)} is available on {device} ({source})")
    raise RaipackError(message, est.hint(avail))
