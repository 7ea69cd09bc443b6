"""The `smoke` stage: load the package and answer prompts on the NPU when one
answers; otherwise say exactly why and run the reference runtime on the CPU,
marked `cpu-reference` — never reported as an NPU run.

On the CPU, the package of an NPU or hybrid target (and its raipack reference package) is also run under the
NPU's numerics by default (`numerics`, unset: pipeline/data/numerics.json "by_target"; stages/smoke/device.py):
its answer to the fixed prompt and its held-out perplexity under BFP16 activations (pipeline/runtime/numerics.py),
the prediction of what the device computes, beside the float perplexity on the same window (the export's,
pipeline/runtime/heldout.py; its length scales with the model: raipack.runtime.budget). `numerics = "float"` in the recipe keeps the float run alone; `perplexity = false`
keeps only the answers; both windows are scored from their prefill on a scoring runtime (pipeline/runtime/scoring.py).
The float run is the check of the fusion: the package's tokens are checked against the export's; BFP16 rounding
would blur that check, so it stays float.

The package decodes every prompt the NPU runtime's way, after one untimed warm-up call (its time is kept as
`ttft_cold_s`: the first call pays for onnxruntime's first run, not for the prompt's length); the export checks
its tokens from prefills (OrtDecoder.forced): the fixed prompt's in two calls, every tier's from one prefill of
the longest tier prompt, of which the others are prefixes (docs/memory.md). By default the export compares the
fixed prompt and the tiers up to all_tiers_up_to; the largest tier runs and is checked for finite logits, and is
compared with the export with `[smoke] export_check = "all"` (or `tiers = "all"`): its check costs the export about
three quarters of the package's own run of it at every size, half of the stage's work (issue 41). The BFP16 answer
is the check budget's length (raipack.runtime.budget, the export's report: 16 tokens, 8 at Llama-3.1-8B)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

from raipack.core.errors import RaipackError, UsageError
from raipack.core.stage import Job, Stage
from raipack.stages.smoke import device

PROMPT = "What is the capital of France?"
FILLER = "The quick brown fox jumps over the lazy dog while the river runs to the sea. "
# the export checks the package's tokens from one prefill of prompt + tokens, this many positions per
# onnxruntime call: its logits output is [1, chunk, vocab] float32 (256 MiB at a 128K vocabulary), not the
# whole prompt's (2 GiB at 4096 tokens), and only the argmax of the compared rows is kept
EXPORT_CHUNK = 512


@dataclass(frozen=True)
class SmokeConfig:
    require_npu: bool = False  # fail instead of falling back to the CPU reference runtime
    max_new_tokens: int = 64  # decode steps checked for NaN on the fixed prompt
    tier_new_tokens: int = 4  # decode steps on each prefill-tier prompt
    max_tier: int = 4096  # longest prefill-tier prompt to run (the CPU reference is slow at 16K)
    tiers: Literal["scaled", "all"] = "scaled"  # scaled: every tier up to all_tiers_up_to, then the largest once; all: every tier
    all_tiers_up_to: int = 1024
    threads: int | None = None
    perplexity: bool | None = None  # the package's held-out perplexity (cpu-reference only); default: when the numerics are not float
    numerics: Literal["float", "bfp16"] | None = None  # None: the target's (bfp16 for NPU and hybrid); bfp16: answer and perplexity under BFP16 too
    export_check: Literal["auto", "all"] = "auto"  # auto: the fixed prompt and the tiers up to all_tiers_up_to against the export; all: every tier run


def tier_prompt(tokenizer, length: int) -> list[int]:
    """A prompt of exactly `length` tokens (plain text, no chat template)."""
    ids = tokenizer(FILLER * (length // 8 + 4))["input_ids"]
    return ids[:length]


def prompt_lengths(tiers: list[int], max_prompt: int, max_tier: int, new_tokens: int, all_up_to: int | None = None) -> list[tuple[int, int]]:
    """(tier, prompt length) of the prompts checked against the export: one inside each prefill tier
    up to `max_tier`, the tier's longest prompt but three, above the tier below; the largest tier's is its
    shortest, one above the tier below: the package pays for the padded tier whatever the prompt, the export's
    check pays for the prompt (at Llama-3.1-8B, 4093 tokens were 358 s of the export's 397). With `all_up_to`,
    only the tiers up to it and the largest one (a long prompt costs the CPU reference and the export quadratic
    time, and the tiers between share its code path). A package without tiers (hybrid: unpadded NPU prefill)
    gets one prompt as long as it takes with `new_tokens` after it, within `max_tier`."""
    cap = min(max_tier, max_prompt)
    if not tiers:
        return [(cap, max(1, cap - new_tokens))]
    inside = [t for t in tiers if t <= cap]
    below = [inside[i - 1] if i else 0 for i in range(len(inside))]
    out = [(t, below[i] + 1 if i == len(inside) - 1 else max(below[i] + 1, t - 3)) for i, t in enumerate(inside)]
    if all_up_to is None:
        return out
    return [p for i, p in enumerate(out) if p[0] <= all_up_to or i == len(out) - 1]


def run(job: Job) -> dict:
    import gc
    import time

    # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
    from raipack.runtime.chat import chat_ids, load_tokenizer, peak_rss_mib
    from raipack.runtime.heap import trim_heap  # late: as above
    from raipack.runtime.reference import ReferenceRuntime  # late: as above
    from raipack.stages.smoke.npu import try_npu  # late: as above

    cfg: SmokeConfig = job.config
    if cfg.export_check not in ("auto", "all"):
        raise UsageError(f"[smoke].export_check is {cfg.export_check!r}; expected \"auto\" or \"all\"", "set export_check in the recipe")
    pkg, export = job.inputs["fuse"], job.inputs["export"]
    tok = load_tokenizer(pkg)
    fixed = chat_ids(tok, PROMPT)
    inputs = [export] + ([Path(job.recipe.model)] if getattr(job.recipe, "model", None) else [])
    attempt = try_npu(pkg, [fixed], cfg.max_new_tokens, untrusted=inputs)  # no provider library from these
    report = {"npu": {"ok": attempt.ok, "reason": attempt.reason}}
    if attempt.ok:
        report.update(device="npu", answer=tok.decode(attempt.tokens[0], skip_special_tokens=True))
        runtime = None
    else:
        job.progress.line(f"  NPU not used: {attempt.reason}", "yellow")
        if cfg.require_npu:
            raise RaipackError(f"the package did not run on the NPU: {attempt.reason}", "install the Ryzen AI runtime and set RYZENAI_EP_PATH, or drop --require-npu")
        started = time.perf_counter()
        runtime = ReferenceRuntime(pkg, threads=cfg.threads)
        report["device"] = "cpu-reference"
    if runtime is None:
        return _summarize(report)

    # the stage's work is the package answering its prompts (loaded for it); the perplexity, the device's numerics
    # and the export's check are raipack's own checks
    numerics = device.numerics_of(cfg, job.profile, report)
    answer_tokens = device.export_answer_tokens(export)
    runs = _run_package(report, runtime, tok, fixed, cfg, job.progress)
    seconds = {"package": time.perf_counter() - started}
    # One model at a time: the package's weights are freed before the next is loaded, the scoring runtimes (float,
    # then BFP16) or the export (at 8B each is ~8 GiB; held together they were the stage's peak). The export checks
    # the package's tokens afterwards.
    pkg_dir = runtime.pkg
    del runtime
    gc.collect()
    trim_heap()  # the freed runtime's pages back to the system before the next model loads: the peak is one model's
    ids: list[int] = []
    if cfg.perplexity if cfg.perplexity is not None else numerics != "float":
        started = time.perf_counter()
        ids = device.scored_float(report, pkg_dir, tok, cfg.threads, job.progress, export)
        seconds["perplexity"] = time.perf_counter() - started
    if numerics != "float":
        started = time.perf_counter()
        length = min(cfg.max_new_tokens, answer_tokens or cfg.max_new_tokens)
        device.device_run(report, pkg_dir, tok, device.Asked(fixed, ids, runs.tokens, length), cfg, job.progress)
        seconds["numerics"] = time.perf_counter() - started
        lacks = device.expected_missing(report, job.recipe.expected_answer)
        if lacks:  # a prediction, not a failure: the float answer is the check; the report's first screen shows both
            job.progress.line(f"  {lacks}", "yellow")
        gc.collect()
        trim_heap()
    started = time.perf_counter()
    up_to = None if cfg.export_check == "all" or cfg.tiers == "all" or not runs.padded else cfg.all_tiers_up_to
    _check_against_export(report, export, runs, cfg.threads, up_to)
    seconds["export_check"] = time.perf_counter() - started
    report.update({f"seconds_{k}": round(v, 2) for k, v in seconds.items()})
    report["peak_rss_mib"] = round(peak_rss_mib(), 1)
    report["expected_answer"] = job.recipe.expected_answer
    problems = _problems(report, job.recipe.expected_answer)
    report["problems"] = problems
    if problems:
        raise RaipackError(f"smoke test failed: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""), "see the smoke report; rebuild with --force from the failing stage")
    return _summarize(report)


class PackageRuns(NamedTuple):
    """What the package answered, for the export to check: the fixed prompt and its tokens, the longest tier
    prompt (every tier's is a prefix of it), the per-tier records (their tokens still in them)."""

    fixed: list[int]
    tokens: list[int]
    longest: list[int]
    tiers: list[dict]
    padded: bool  # the package has prefill tiers (a hybrid package's prompt runs unpadded: its one prompt is always compared)


def _run_package(report: dict, runtime, tok, fixed: list[int], cfg: SmokeConfig, progress) -> PackageRuns:
    """The package answers the fixed prompt and one prompt per prefill tier, the NPU runtime's way, and must
    refuse a prompt over its limit."""
    # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
    from raipack.runtime.chat import timed_generate
    from raipack.runtime.reference import RuntimeRefusal  # late: as above

    cold = timed_generate(runtime, fixed, 1, stop_at_eos=False)  # the warm-up: the first call pays onnxruntime's first run
    report["ttft_cold_s"] = round(cold.ttft, 4)
    main = timed_generate(runtime, fixed, cfg.max_new_tokens, stop_at_eos=False)
    answer_tokens = main.tokens[: next((i + 1 for i, t in enumerate(main.tokens) if t in runtime.eos_token_ids), len(main.tokens))]
    report.update(answer=tok.decode(answer_tokens, skip_special_tokens=True).strip(), finite=main.finite,
                  ttft_s={str(len(fixed)): round(main.ttft, 4)}, decode_tokens_per_s=round(main.decode_tps, 1))
    per_tier = []
    if cfg.tiers not in ("scaled", "all"):
        raise UsageError(f"[smoke].tiers is {cfg.tiers!r}; expected \"scaled\" or \"all\"", "set tiers in the recipe, or --smoke scaled|all")
    lengths = prompt_lengths(runtime.prefill_tiers, runtime.max_prompt_length, cfg.max_tier, cfg.tier_new_tokens,
                             None if cfg.tiers == "all" else cfg.all_tiers_up_to)
    longest = tier_prompt(tok, max((n for _, n in lengths), default=0))  # every tier's prompt is a prefix of it
    with progress.task("prefill tiers", len(lengths)) as advance:
        for t, length in lengths:
            got = timed_generate(runtime, longest[:length], cfg.tier_new_tokens, stop_at_eos=False)
            per_tier.append({"tier": t, "prompt_tokens": length, "prefill_calls": runtime.prefill_calls(), "ttft_s": round(got.ttft, 4), "finite": got.finite, "tokens": got.tokens})
            report["ttft_s"][str(length)] = round(got.ttft, 4)
            advance()
    over = runtime.max_prompt_length + 1
    try:
        runtime.generate([tok.eos_token_id or 0] * over, 1)
        report["overlong_prompt_refused"] = False
    except RuntimeRefusal as exc:
        report["overlong_prompt_refused"] = True
        report["overlong_prompt_message"] = str(exc)
    return PackageRuns(fixed, list(main.tokens), longest, per_tier, bool(runtime.prefill_tiers))


def _check_against_export(report: dict, export: Path, runs: PackageRuns, threads: int | None, up_to: int | None = None) -> None:
    """The export's greedy choices along the package's tokens: the fixed prompt in two calls, every tier up to `up_to`
    (all when None) from one prefill of the longest such prompt (OrtDecoder.forced); each tier record gets
    `tokens_match_export` for its tokens, None with `export_not_checked` (why) for a tier above `up_to`."""
    # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
    from raipack.runtime.ortloop import OrtDecoder

    reference = OrtDecoder(export, threads=threads, logits_rows=True)  # the lm_head computes the compared rows only
    fixed = runs.fixed
    expected = reference.forced(fixed, {len(fixed): runs.tokens}, EXPORT_CHUNK)[len(fixed)]  # two export calls, not a decode loop
    report["tokens_match_export"] = runs.tokens == list(expected)
    checked = [t for t in runs.tiers if up_to is None or t["tier"] <= up_to]
    want = reference.forced(runs.longest, {t["prompt_tokens"]: t["tokens"] for t in checked}, EXPORT_CHUNK) if checked else {}
    for t in runs.tiers:
        tokens = list(t.pop("tokens"))
        if t["prompt_tokens"] in want:
            t["tokens_match_export"] = tokens == want[t["prompt_tokens"]]
        else:
            t["tokens_match_export"] = None
            t["export_not_checked"] = (f"its {t['prompt_tokens']} + {len(tokens)} tokens would cost the export about three quarters of the package's own "
                                       "run of this tier; [smoke] export_check = \"all\" compares it")
    report["tiers"] = runs.tiers


def _problems(r: dict, expected: str | None) -> list[str]:
    out = []
    if not r.get("finite", True) or not all(t["finite"] for t in r.get("tiers", [])):
        out.append("non-finite logits (NaN or Inf)")
    if not r.get("tokens_match_export", True):
        out.append("greedy tokens differ from the unfused export on the fixed prompt")
    out += [f"prefill tier {t['tier']}: tokens differ from the export" for t in r.get("tiers", []) if t["tokens_match_export"] is False]
    if not r.get("overlong_prompt_refused", True):
        out.append("a prompt longer than max_prompt_length was not refused")
    if expected and expected.lower() not in r.get("answer", "").lower():
        out.append(f"the answer {r.get('answer', '')!r} does not contain {expected!r}")
    return out


def _summarize(report: dict) -> dict:
    numerics = report.get("numerics", "float")
    answer = report.get(f"answer_{numerics}", report.get("answer", ""))
    how = f" ({numerics.upper()}, predicted)" if numerics != "float" else ""
    report["summary"] = f"{report['device']}{how}: {answer[:60]!r}" + (f", {report['decode_tokens_per_s']} tok/s" if "decode_tokens_per_s" in report else "")
    report["quality"] = {"device": report["device"], "answer": report.get("answer", ""), "tokens_match_export": report.get("tokens_match_export")}
    report["quality"].update({k: report[k] for k in device.QUALITY_KEYS if k in report})
    return report


def run_and_record(job: Job) -> dict:
    report = run(job)
    (job.workdir / "smoke.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


STAGE = Stage(
    name="smoke",
    version="4",
    config=SmokeConfig,
    inputs=("fuse", "export"),
    output_profile=lambda job: None,
    run=run_and_record,
    tools=("onnxruntime", "onnxruntime-genai", "transformers"),
    kind="smoke",
)
