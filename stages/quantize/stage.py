"""The `quantize` stage: AMD Quark AWQ as in AMD's Ryzen AI recipe, then a
quality record (perplexity of source and quantized model, greedy answer)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from raipack.core.errors import RaipackError, UsageError
from raipack.core.stage import Job, MemoryEstimate, Stage
from raipack.npu.spec import Profile
from raipack.stages.quantize.quark_awq import DEFAULT_NUM_SAMPLES, DEFAULT_SEQ_LEN

PROMPT = "What is the capital of France?"


def full_answer_tokens() -> int:
    """The probes' greedy answer to PROMPT at the full budget: a sentence's worth of tokens (pipeline/data/probes.json
    answer_tokens, 16; 32 before issue 25: at Llama-3.1-8B each step is about 0.8 s per model in transformers); fewer
    above 0.6B forward parameters with quality_tokens = "auto" (pipeline/runtime/budget.py)."""
    from raipack.runtime.budget import probes_data  # late: the stage registry imports every stage by name

    return int(probes_data()["answer_tokens"])


@dataclass(frozen=True)
class QuantizeConfig:
    algorithm: Literal["awq", "gptq", "rtn"] = "awq"
    group_size: int | str = "auto"  # 128, 64, 32 or "auto" (largest that divides every layer)
    exclude_layers: list[str] = field(default_factory=lambda: ["lm_head"])
    lm_head: int | str = "exclude"  # "exclude" (AMD's NPU recipe) or 32, 64, 128: uint4 asymmetric with its own group (hybrid: 32)
    calib_data: str | None = None  # .txt or .jsonl; default: the corpus raipack ships
    num_samples: int = DEFAULT_NUM_SAMPLES
    seq_len: int = DEFAULT_SEQ_LEN
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # "auto": the source's, bfloat16 kept (preflight.resolve_dtype)
    device: Literal["cpu", "cuda"] = "cpu"
    max_ppl_increase: float | None = None  # fail when quantized/source perplexity - 1 exceeds this
    quality: bool = True  # measure perplexity and the greedy answer
    # held-out tokens the perplexity probe scores, in `dtype`; "auto": 256 and 16-token answers up to 0.6B forward parameters,
    # fewer in proportion above (pipeline/runtime/budget.py: 124 and 8 at Llama-3.2-1B, 64 and 8 at Llama-3.1-8B)
    quality_tokens: int | Literal["auto"] = "auto"


def run(job: Job) -> dict:
    from pathlib import Path

    # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
    from raipack.data import heldout_text
    from raipack.runtime.budget import probe_budget  # late: as above
    from raipack.stages.quantize.calibration import read_texts  # late: as above
    from raipack.stages.quantize.preflight import read_config  # late: as above
    from raipack.stages.quantize.quark_awq import quantize  # late: as above

    cfg: QuantizeConfig = job.config
    if isinstance(cfg.group_size, str) and cfg.group_size != "auto":
        raise UsageError(f"[quantize].group_size is {cfg.group_size!r}; expected 128, 64, 32 or \"auto\"", "set group_size in the recipe or --group-size")
    _check_quality_tokens(cfg.quality_tokens)
    src = job.inputs["source"]
    texts = read_texts(Path(cfg.calib_data)) if cfg.calib_data else None
    budget = probe_budget(read_config(src), cfg.quality_tokens)
    # the source's probe runs on the model Quark loads, before it is quantized: an 8B source is read from disk once
    before = (lambda model: probe_source(model, src, heldout_text(), tokens=budget.tokens, answer_tokens=budget.answer_tokens)) if cfg.quality else None
    report = quantize(src, job.workdir, algorithm=cfg.algorithm, group_size=cfg.group_size, exclude_layers=tuple(cfg.exclude_layers),
                      calib_texts=texts, num_samples=cfg.num_samples, seq_len=cfg.seq_len, dtype=cfg.dtype, device=cfg.device,
                      progress=job.progress.callback("quantize"), notify=job.progress.line, lm_head=cfg.lm_head, before=before)
    source_probe = report.pop("source_probe", None)
    for warning in report.get("warnings", []):
        job.progress.line(f"  warning: {warning}", "yellow")
    if cfg.quality:
        report["quality"] = measure(src, job.workdir, heldout_text(), dtype=report["dtype"], tokens=(budget.tokens, budget.answer_tokens), source_probe=source_probe)
        report["quality"]["budget"] = budget.basis
        ratio = report["quality"]["ppl_increase"]
        if cfg.max_ppl_increase is not None and ratio > cfg.max_ppl_increase:
            q = report["quality"]
            raise RaipackError(f"quantized perplexity {q['ppl_quantized']:.2f} is {ratio:.1%} above the source's {q['ppl_source']:.2f}, more than max_ppl_increase {cfg.max_ppl_increase:.1%}",
                               "use AWQ with more calibration samples, or relax [quantize].max_ppl_increase")
    q = report.get("quality", {})
    report["summary"] = summary(cfg.algorithm, report)
    return report


def summary(algorithm: str, report: dict) -> str:
    """The stage line: scheme, lm_head, AWQ's scaling groups as applied, perplexity."""
    head = report.get("lm_head", "exclude")
    text = f"{algorithm} uint4 g{report['group_size']}, {report['layers_quantized']} linears, lm_head " + ("excluded" if head == "exclude" else f"g{head['group_size']}")
    awq = report.get("awq")
    if awq:
        text += ", AWQ scaled " + "; ".join(f"{g['prev_op']} -> {'/'.join(n.rsplit('.', 1)[-1] for n in g['layers'])} x{g['decoder_layers_scaled']}"
                                           for g in awq["scaling_groups"])
    q = report.get("quality", {})
    return text + (f", ppl {q['ppl_source']:.2f} → {q['ppl_quantized']:.2f}" if q else "")


def _check_quality_tokens(value: int | str) -> None:  # str: the recipe parser admits only "auto"
    if value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise UsageError(f"[quantize].quality_tokens is {value!r}; expected \"auto\" or an integer of at least 2 (perplexity scores the tokens after the first)",
                         'set quality_tokens = "auto" (the default), or quality = false to skip the probes')


def probe_source(model, source, text: str, *, tokens: int = 256, answer_tokens: int | None = None) -> dict:
    """The source's probe on a model already loaded (Quark's, before it quantizes): its perplexity on the first
    `tokens` tokens of `text` and its greedy answer, with the seconds they took."""
    import time

    from transformers import AutoTokenizer

    # late: the registry imports every stage by name, so torch/quark load only when measuring
    from raipack.stages.quantize.owned import release_resident_pages

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(source), trust_remote_code=False, local_files_only=True)
    scores = _scores("source", model, tok, text, (tokens, answer_tokens or full_answer_tokens()))
    # the probe read the whole mapped lm_head (1 GiB at 8B); its pages would stay resident through Quark's export, on top of its peak
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    released = release_resident_pages([getattr(embed, "weight", None), getattr(head, "weight", None)])
    return {**scores, "seconds": time.perf_counter() - t0, "released_bytes": released}


def _scores(label: str, model, tok, text: str, budget: tuple[int, int]) -> dict:
    """One model's probe: `ppl_LABEL`, its perplexity on the first `budget[0]` tokens of `text` (one forward), and
    `answer_LABEL`, its greedy answer to PROMPT in `budget[1]` new tokens at most."""
    # late: the registry imports every stage by name, so torch/quark load only when measuring; tests stub quality.greedy_answer
    from raipack.stages.quantize.quality import greedy_answer, perplexity

    tokens, answer_tokens = budget
    return {f"ppl_{label}": round(perplexity(model, tok, text, max_len=tokens, max_tokens=tokens), 4),
            f"answer_{label}": greedy_answer(model, tok, PROMPT, max_new_tokens=answer_tokens)}


def measure(source, quantized, text: str, *, dtype: str = "float32", tokens: int | tuple[int, int] = 256, source_probe: dict | None = None) -> dict:
    """Perplexity on the first `tokens` tokens of `text` (one forward) and the greedy answer (full_answer_tokens() new tokens, or
    `tokens` is the pair (perplexity tokens, answer tokens): raipack.runtime.budget.probe_budget), of the source in
    the stage's `dtype` and of the quantized export as transformers reloads it, its linears dequantized once
    (Quark's modules dequantize on every call: the greedy decode was most of the probes' time). `source_probe`:
    the source's, already measured on the model Quark loaded (probe_source); the source is then not loaded again."""
    import time

    # late: the registry imports every stage by name, so torch/quark load only when measuring; tests stub heap.trim_heap, quality.greedy_answer
    from raipack.runtime.heap import trim_heap
    from raipack.runtime.quark_hf import dequantize_once  # late: as above
    from raipack.stages.quantize.owned import own_mapped_tensors  # late: as above
    from raipack.stages.quantize.quality import load_hf  # late: as above

    tokens, answer_tokens = tokens if isinstance(tokens, tuple) else (tokens, full_answer_tokens())
    t0 = time.perf_counter()
    out: dict = {}
    parts: dict[str, float] = {}  # what each part of the probes cost: the source's probe, the export's reload, its dequantization, its probe
    models = [("source", source), ("quantized", quantized)]
    if source_probe is not None:
        out.update(ppl_source=source_probe["ppl_source"], answer_source=source_probe["answer_source"])
        parts["source_probe"] = round(source_probe["seconds"], 2)
        out["source_pages_released_bytes"] = source_probe.get("released_bytes", 0)  # the mapped lm_head's pages the probe had read
        t0 -= source_probe["seconds"]  # the probes' seconds: both models'
        models = models[1:]
    for label, folder in models:
        t_part = time.perf_counter()
        model, tok = load_hf(folder, dtype=dtype)
        if label == "quantized":
            # the packed linears in memory of their own (read with pread, not through the mapping), so each is
            # freed as it is dequantized; as views of the mapped file their pages stayed resident beside the
            # bfloat16 copies (the 8B AWQ stage peaked at 20.37 GiB there). The embedding and lm_head stay views.
            embed, head = model.get_input_embeddings(), model.get_output_embeddings()
            out["quantized_weights_owned"] = own_mapped_tensors(model, keep=[getattr(embed, "weight", None), getattr(head, "weight", None)])
            # in the stage's dtype, as the source runs; the heap trimmed after each swap: Quark leaves glibc's heap 14 to
            # 34 GiB wide and mostly free, every allocation reuses it, and the packed weights and temporaries freed in its
            # middle stayed resident (the 8B RTN probe's dequantization ended at 16.3 and 21.0 GiB of anonymous memory
            # for 13 GiB of bfloat16 linears; trimmed, 13.7 GiB and the stage's peak 15.4 GiB, 12-18 s more)
            parts["quantized_load"] = round(time.perf_counter() - t_part, 2)
            t_part = time.perf_counter()
            dequantize_once(model, dtype, after_each=trim_heap)
            parts["quantized_dequantize"] = round(time.perf_counter() - t_part, 2)
            t_part = time.perf_counter()
        out.update(_scores(label, model, tok, text, (tokens, answer_tokens)))
        parts[f"{label}_probe" if label == "quantized" else "source_load_and_probe"] = round(time.perf_counter() - t_part, 2)
        del model
        trim_heap()  # the dequantized linears' heap chunks (8 GiB at 8B) are not left resident for the stages after
    out["ppl_increase"] = round(out["ppl_quantized"] / out["ppl_source"] - 1, 4)
    out["prompt"] = PROMPT
    out["tokens"] = tokens
    out["answer_tokens"] = answer_tokens
    out["dtype"] = dtype
    out["seconds"] = round(time.perf_counter() - t0, 2)
    out["seconds_parts"] = parts
    return out


def preflight(config: QuantizeConfig, target: Profile) -> None:
    """Refuse a bad [quantize].lm_head or quality_tokens before any stage runs (the head's width is checked against the model in the stage)."""
    _check_quality_tokens(config.quality_tokens)
    # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
    from raipack.stages.quantize.preflight import resolve_lm_head

    resolve_lm_head({}, config.lm_head)


def memory(config: QuantizeConfig, model_config: dict | None, target: Profile) -> MemoryEstimate:
    """The estimate from config.json and the options (stages/quantize/memory.py); the runner refuses the stage
    before it loads anything when it exceeds the free memory. No config.json: ValueError (the registry's allowance)."""
    # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
    from raipack.stages.quantize.memory import stage_estimate
    from raipack.stages.quantize.preflight import resolve_dtype  # late: as above

    if model_config is None:
        raise ValueError("no config.json to estimate from")
    return stage_estimate(model_config, dtype=resolve_dtype(config.dtype, model_config, config.device), device=config.device, num_samples=config.num_samples,
                          seq_len=config.seq_len, algorithm=config.algorithm)


def output_profile(job: Job) -> str:
    return "quark-export"


STAGE = Stage(
    name="quantize",
    version="1",
    config=QuantizeConfig,
    inputs=("source",),
    output_profile=output_profile,
    run=run,
    tools=("amd-quark", "torch", "transformers"),
    kind="quark",
    profile_keys=(),  # the release and its tiers do not change this stage's output
    preflight=preflight,
    memory=memory,
)
