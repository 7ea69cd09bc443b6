"""The build's perplexity chain, from the stage reports: source → Quark → export → package (float) →
package (BFP16 activations, predicted on the device), each link with its drop from the link before.

A drop compares two perplexities on one window: the quantize stage measures the source and its Quark model
on its own window, the export stage the Quark model and the export on the export's window, and the smoke
stage the package (float and BFP16) on the export's window too; the "Quark model (export's window)" row
starts the export's window and has no drop of its own. BFP16 is Quark's definition of the NPU's
activation format; AMD's exact arithmetic is not published, so the BFP16 row is a prediction (HONEST).

Shared by report.html (collect.py), report.json ("quality_chain", written by the build), the model card
and the build's last lines (chain_lines)."""

from __future__ import annotations

from raipack.report import inputs
from raipack.runtime.numerics import HONEST


def quality_chain(stages: list[dict]) -> list[dict]:
    """Rows {stage, model, ppl, drop, vs, answer[, note]} in build order."""
    rows: list[dict] = []
    for s in stages:
        q = (s.get("report") or {}).get("quality")
        if not isinstance(q, dict):
            continue
        name = s.get("name")
        if "ppl_source" in q:
            rows.append(_row(name, "source", q.get("ppl_source"), None, None, q.get("answer_source")))
            rows.append(_row(name, "quantized (Quark)", q.get("ppl_quantized"), q.get("ppl_source"), _increase(q.get("ppl_increase")), q.get("answer_quantized")))
        elif "ppl_exported" in q:
            rows.append(_row(name, "Quark model (export's window)", q.get("ppl_quark"), None, None, None))
            rows.append(_row(name, "export", q.get("ppl_exported"), q.get("ppl_quark"), _ratio(q.get("ppl_ratio")),
                             "greedy tokens identical" if q.get("greedy_identical") else "greedy tokens differ"))
        elif "tokens_match_export" in q:
            export = next((r["ppl"] for r in reversed(rows) if r["model"] == "export"), None)  # the same window
            device = q.get("device", "?")
            rows.append(_row(name, f"package ({device}, float)", q.get("ppl_package"), export,
                             "tokens equal the export's" if q.get("tokens_match_export") else "tokens differ from the export's", q.get("answer")))
            if "ppl_package_bfp16" in q or "answer_bfp16" in q:
                row = _row(name, f"package ({device}, BFP16 activations, predicted on the device)", q.get("ppl_package_bfp16"), q.get("ppl_package"),
                           _vs_float(q.get("ppl_package_bfp16"), q.get("ppl_package")), q.get("answer_bfp16"))
                rows.append(dict(row, note=q.get("numerics_note") or HONEST, device_numerics=True))
    return rows


def answer_change(stages: list[dict]) -> dict | None:
    """{float, bfp16} answers to the fixed prompt when BFP16 numerics changed the greedy answer, else None."""
    for s in stages:
        q = (s.get("report") or {}).get("quality")
        if isinstance(q, dict) and "answer_bfp16" in q:
            changed = q.get("numerics_changed_answer")
            if changed is None:  # a report written before the flag: compare the texts
                changed = str(q.get("answer_bfp16", "")).strip() != str(q.get("answer", "")).strip()
            return {"float": q.get("answer", ""), "bfp16": q.get("answer_bfp16", "")} if changed else None
    return None


def document(stages: list[dict]) -> dict | None:
    """report.json's "quality_chain": the rows, whether BFP16 changed the answer, and what BFP16 is; None without rows."""
    rows = quality_chain(stages)
    if not rows:
        return None
    doc: dict = {"rows": rows, "bfp16_changed_answer": answer_change(stages)}
    if any(r.get("device_numerics") for r in rows):
        doc["note"] = HONEST
    return doc


def chain_lines(stages: list[dict]) -> list[str]:
    """The chain in a few plain lines: the build's last lines and the model card's."""
    rows = [r for r in quality_chain(stages) if inputs._number(r["ppl"])]
    if not rows:
        return []
    out = ["perplexity " + " → ".join(f"{_short(r['model'])} {r['ppl']:.2f}" + (f" ({r['drop']})" if r["drop"] else "")
                                      for r in rows if r["model"] != "Quark model (export's window)")]
    if any(r.get("device_numerics") for r in rows):
        out.append(f"BFP16: {HONEST}")
    change = answer_change(stages)
    if change:
        out.append(f"BFP16 changes the answer to the fixed prompt: float {change['float'][:80]!r}, BFP16 {change['bfp16'][:80]!r}")
    return out


def _short(model: str) -> str:
    return "package (BFP16, predicted)" if "BFP16" in model else model.replace("cpu-reference, ", "")


def _row(stage, model: str, ppl, before, vs, answer) -> dict:
    return {"stage": stage, "model": model, "ppl": ppl, "drop": _drop(ppl, before), "vs": vs, "answer": answer}


def _drop(ppl, before) -> str | None:
    """The perplexity's change from the link before (worse is positive), in points and percent."""
    if not (inputs._number(ppl) and inputs._number(before)) or not before:
        return None
    return f"{ppl - before:+.2f} ({ppl / before - 1:+.2%})"


def _vs_float(bfp, flt):
    return f"{bfp / flt - 1:+.2%} vs float" if inputs._number(bfp) and inputs._number(flt) and flt else None


def _increase(v):
    return f"{v:+.1%}" if isinstance(v, (int, float)) else None


def _ratio(v):
    return f"ratio {v:.4f}" if isinstance(v, (int, float)) else None
