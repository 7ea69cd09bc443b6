"""The smoke stage's prediction of what the device computes: the package under the NPU's numerics.

Which numerics: the recipe's `[smoke] numerics`, else the target's (pipeline/data/numerics.json
"by_target": BFP16 activations for NPU and hybrid packages and raipack's reference packages of them;
float for the others). Without amd-quark (whose BFPQuantizeDequantize kernel the emulation runs) the
default falls back to float and the report says so (`numerics_skipped`); a recipe that asks for bfp16
gets the runtime's own refusal. BFP16 as Quark defines it; the NPU's exact arithmetic is not published
(pipeline/runtime/numerics.py HONEST, shown with every BFP16 figure).

The float runtime is freed before the BFP16 one loads (one model's weights at a time, as for the
export's check), so the stage's peak memory is the larger of the two runs, not their sum. Both perplexities
are scored from the window's prefill (pipeline/runtime/scoring.py), not one token step per token.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import NamedTuple

from raipack.data import load_data

# what the stage's "quality" block carries to report.json, the report page and the model card
QUALITY_KEYS = ("numerics", "numerics_skipped", "ppl_package", "ppl_package_bfp16", "answer_bfp16", "numerics_changed_answer",
                "ppl_window_tokens", "numerics_note")


def target_numerics(target) -> str:
    """The numerics of the device a profile target (a raipack.npu.target.Target or its value) computes with."""
    value = getattr(target, "value", target)
    return load_data("numerics.json")["by_target"].get(str(value), "float")


def numerics_of(cfg, profile, report: dict) -> str:
    """The numerics the stage predicts the device's answer under, recorded in `report["numerics"]`."""
    if cfg.numerics is not None:  # the recipe's choice
        report["numerics"] = cfg.numerics
        return cfg.numerics
    mode = target_numerics(getattr(profile, "target", None))
    if mode != "float" and importlib.util.find_spec("quark") is None:
        report["numerics_skipped"] = f"{mode} not run: amd-quark (raipack's build extra) is not installed; the package ran in float only"
        mode = "float"
    report["numerics"] = mode
    return mode


def _export_report(export: Path) -> dict:
    import json

    try:
        report = json.loads((Path(export) / "manifest.json").read_text("utf-8"))["report"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return report if isinstance(report, dict) else {}


def export_window(export: Path) -> int | None:
    """The held-out tokens the export's parity perplexity read (its report in manifest.json; `[export].parity_tokens`,
    scaled with the model by default: raipack.runtime.budget), None when the export's report does not say."""
    try:
        tokens = _export_report(export)["parity"]["perplexity"]["tokens"]
    except (KeyError, TypeError):
        return None
    return tokens if _count(tokens) and tokens >= 2 else None


def export_answer_tokens(export: Path) -> int | None:
    """The answer length of the export's check budget as its report records it (raipack.runtime.budget.Budget: 16 up
    to 0.6B forward parameters, 8 at Llama-3.2-1B and above); None when the report does not say."""
    budget = _export_report(export).get("check_budget")
    answer = budget.get("answer_tokens") if isinstance(budget, dict) else None
    return answer if _count(answer) and answer >= 1 else None


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def float_perplexity(report: dict, runtime, tok, progress, window: int | None = None) -> list[int]:
    """The package's held-out perplexity in float on the export's window (`window` tokens; the full MAX_TOKENS when the
    export's report does not say), so it sits beside the export's figure; the window's ids, [] when too short."""
    from raipack.runtime.heldout import heldout_ids, package_perplexity  # late: the stage's modules load with the runner: heavy imports wait

    ids = heldout_ids(tok, min(runtime.max_length - 1, window or runtime.max_length))
    if len(ids) < 2:
        return []
    report["ppl_window_tokens"] = len(ids)
    with progress.task("held-out perplexity (float)", 1) as advance:
        report["ppl_package"] = round(package_perplexity(runtime, ids), 4)
        advance()
    return ids


class Asked(NamedTuple):
    """What the device run answers and scores."""

    fixed: list[int]  # the fixed prompt
    window: list[int]  # the held-out window, [] for no perplexity
    float_tokens: list[int]  # the float run's answer to the fixed prompt
    length: int  # this answer's new tokens: the check budget's (the export's report; 8 at Llama-3.1-8B)


def scored_float(report: dict, pkg: Path, tok, threads: int | None, progress, export: Path) -> list[int]:
    """float_perplexity on a scoring runtime of its own (the window's rows from its prefill, not one token step per
    token), freed before it returns; the window's ids."""
    import gc

    from raipack.runtime.heap import trim_heap  # late: heavy imports wait for the run (see above)
    from raipack.runtime.scoring import ScoringRuntime  # late: as above

    scorer = ScoringRuntime(pkg, threads=threads, verify="sizes")  # hashed by the stage's first load (see device_run)
    ids = float_perplexity(report, scorer, tok, progress, export_window(export))
    del scorer
    gc.collect()
    trim_heap()  # its pages back to the system before the BFP16 runtime loads
    return ids


def device_run(report: dict, pkg: Path, tok, asked: Asked, cfg, progress) -> None:
    """The package under `report["numerics"]`: its greedy answer to the fixed prompt, `asked.length` tokens so the
    prediction's decode steps stop growing with the model, and whether it differs from as many of the float answer's
    tokens; its held-out perplexity when `asked` has a window."""
    numerics = report["numerics"]
    fixed, ids, float_tokens, length = asked
    from raipack.runtime.heldout import package_perplexity  # late: heavy imports wait for the run (see above)

    # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
    from raipack.runtime.numerics import HONEST
    from raipack.runtime.scoring import ScoringRuntime  # late: as above

    # the window scored from its prefill; the package's files were hashed against its manifest by the stage's first
    # load moments before (the runtime that answered and was checked against the export): sizes and offsets here
    runtime = ScoringRuntime(pkg, threads=cfg.threads, numerics=numerics, verify="sizes")
    with progress.task(f"{numerics.upper()} numerics (predicted on the device)", 1 + bool(ids)) as advance:
        got = runtime.generate(fixed, length, stop_at_eos=True)
        stop = runtime.eos_token_ids
        answer_text = tok.decode([t for t in got if t not in stop], skip_special_tokens=True).strip()
        report[f"answer_{numerics}"] = answer_text
        report[f"answer_{numerics}_tokens"] = len(got)
        float_part = float_tokens[: next((i + 1 for i, t in enumerate(float_tokens[:length]) if t in stop), length)]
        report["numerics_changed_answer"] = list(got) != list(float_part)
        advance()
        if ids:
            report[f"ppl_package_{numerics}"] = round(package_perplexity(runtime, ids), 4)
            advance()
    report["numerics_note"] = HONEST


def expected_missing(report: dict, expected: str | None) -> str | None:
    """One line when the answer predicted under the device's numerics lacks the recipe's expected answer, else None.
    Not a failure of the stage: the float answer is what the stage checks (BFP16 is Quark's definition, not a
    measurement of the NPU); the line and the report's notice say it."""
    answer = report.get(f"answer_{report.get('numerics')}")
    if not expected or answer is None or expected.lower() in str(answer).lower():
        return None
    return f"the answer predicted under {str(report['numerics']).upper()} {str(answer)[:80]!r} does not contain {expected!r} (the float answer does)"
