"""The `export` stage: the onnxruntime-genai model builder on the Quark export,
Quark's exclusions kept in float, the source's tokenizer files put back unchanged
(report["tokenizer"]), then parity against the Quark model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from raipack.core.errors import RaipackError, UsageError
from raipack.core.stage import Job, Stage

PROMPTS = ["What is the capital of France?", "Write one sentence about the sea."]


@dataclass(frozen=True)
class ExportConfig:
    keep_excluded_float: bool = True  # keep lm_head/embedding float when Quark excluded them
    extra_options: dict = field(default_factory=dict)  # builder extra options (name -> value)
    parity: bool = True
    # parity's budget keeps it a small part of the stage at 8B (issue 25: 32 steps and 512 tokens made parity
    # 270 s beside the builder's 238 s); 16 steps with 8 positions compared and 256 tokens still catch a wrong graph.
    # "auto": the check budget's answer length (raipack.runtime.budget: 16 up to 0.6B forward parameters, 8 above)
    parity_steps: int | Literal["auto"] = "auto"
    parity_positions: int = 8  # generated positions per prompt whose logits rows parity compares (first, last, seeded others)
    # held-out tokens both perplexities read, and the smoke stage's window (it reads the export's report); "auto": 256 up to
    # 0.6B forward parameters, fewer in proportion above (raipack.runtime.budget: 124 at Llama-3.2-1B, 64 at Llama-3.1-8B)
    parity_tokens: int | Literal["auto"] = "auto"
    max_ppl_ratio: float = 1.01  # exported / Quark perplexity on the held-out text


def run(job: Job) -> dict:
    # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
    from raipack.data import heldout_text
    from raipack.runtime.budget import folder_budget  # late: as above
    from raipack.stages.export.builder import export  # late: as above
    from raipack.stages.export.parity import parity  # late: as above

    cfg: ExportConfig = job.config
    quark = job.inputs["quantize"]
    # every target exports int4 for the CPU with float32 activations: raipack's reference backend fuses
    # and runs that graph (hybrid packages too: their prefill and decode are simulated on the CPU), and
    # the smoke stage compares every package with it. AMD's hybrid flow exports for DirectML itself
    # when model_generate(mode="hybrid") is given the Quark folder.
    execution_provider = "cpu"
    report = export(quark, job.workdir, execution_provider=execution_provider, keep_excluded_float=cfg.keep_excluded_float, extra_options=dict(cfg.extra_options))
    if cfg.parity:
        import gc

        # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
        from raipack.runtime.heap import trim_heap

        gc.collect()
        trim_heap()  # the builder's freed tensors go back to the system before parity loads its models
        budget = folder_budget(quark, cfg.parity_tokens)  # the Quark export's config.json
        steps = budget.answer_tokens if cfg.parity_steps == "auto" else cfg.parity_steps
        p = parity(quark, job.workdir, PROMPTS, heldout_text(), steps=steps, positions=cfg.parity_positions,
                   max_heldout_tokens=budget.tokens)
        report["parity"] = p
        report["check_budget"] = budget._asdict()  # the smoke stage's perplexity window is this one
        ppl = p["perplexity"]
        report["quality"] = {"ppl_quark": ppl["transformers"], "ppl_exported": ppl["onnx"], "ppl_ratio": ppl["ratio"],
                             "logit_cosine_min": p["cosine_min"], "greedy_identical": p["greedy_identical"]}
        if ppl["ratio"] > cfg.max_ppl_ratio:
            raise RaipackError(f"the exported model's perplexity {ppl['onnx']:.3f} is {ppl['ratio'] - 1:.2%} above the Quark model's {ppl['transformers']:.3f}, more than max_ppl_ratio {cfg.max_ppl_ratio}",
                               "keep Quark's exclusions in float ([export].keep_excluded_float = true) or relax [export].max_ppl_ratio")
    q = report.get("quality", {})
    report["summary"] = "OGA int4 " + execution_provider + (f", ppl ratio {q['ppl_ratio']:.4f}, greedy {'identical' if q['greedy_identical'] else 'differs'}" if q else "")
    return report


def preflight(config: ExportConfig, target: dict) -> None:
    """Refuse a parity setting that cannot be sampled before any stage runs."""
    least = {"parity_steps": 1, "parity_positions": 2, "parity_tokens": 2}
    for name, value in (("parity_steps", config.parity_steps), ("parity_positions", config.parity_positions), ("parity_tokens", config.parity_tokens)):
        if name in ("parity_tokens", "parity_steps") and value == "auto":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < least[name]:
            raise UsageError(f"[export].{name} is {value!r}; expected a whole number of at least {least[name]}"
                             + (" (the first and the last generated position are always compared)" if name == "parity_positions" else "")
                             + (' or "auto"' if name in ("parity_tokens", "parity_steps") else ""),
                             f"set {name} to {ExportConfig.__dataclass_fields__[name].default!r} (the default), or parity = false to skip parity")


STAGE = Stage(
    name="export",
    version="2",  # 2: the tokenizer files are the source's, byte for byte (builder.carry_tokenizer); older entries are rebuilt
    config=ExportConfig,
    inputs=("quantize",),
    output_profile=lambda job: "oga-export",
    run=run,
    tools=("onnxruntime-genai", "onnx", "onnxruntime", "transformers", "torch"),
    kind="oga",
    profile_keys=(),  # one export serves every target (see run)
    preflight=preflight,
)
