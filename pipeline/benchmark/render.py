"""`raipack bench` output: a text table like AMD's model_benchmark summary, CSV, JSON."""

from __future__ import annotations

import csv
import io
import json

COLUMNS = ("backend", "ran_on", "prompt_tokens", "gen_tokens", "runs", "ttft_ms_median", "ttft_ms_min", "ttft_ms_max",
           "tokens_per_s_median", "tokens_per_s_min", "tokens_per_s_max", "peak_rss_mb", "peak_rss_scope", "prompt_source")


def as_json(doc: dict) -> str:
    return json.dumps(doc, indent=2) + "\n"


def as_csv(doc: dict) -> str:
    """One line per backend and prompt length; the ratios as rows of backend `reference/oga`."""
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in doc["rows"]:
        flat = {k: r.get(k) for k in COLUMNS}
        for key in ("ttft_ms", "tokens_per_s"):
            flat.update({f"{key}_{s}": r[key][s] for s in ("median", "min", "max")})
        w.writerow(flat)
    for q in doc["ratios"]:
        w.writerow({"backend": q["of"], "ran_on": "ratio of the medians", "prompt_tokens": q["prompt_tokens"],
                    "ttft_ms_median": q["ttft"], "tokens_per_s_median": q["tokens_per_s"], "peak_rss_mb": q["peak_rss"]})
    return out.getvalue()


def _cell(stat: dict) -> str:
    return f"{stat['median']:.1f} ({stat['min']:.1f}–{stat['max']:.1f})"


def as_text(doc: dict) -> str:
    """Per prompt length, each backend's TTFT, tokens/s and peak MB (median, min–max), then the ratios."""
    backends = list(dict.fromkeys(r["backend"] for r in doc["rows"]))
    by = {(r["backend"], r["prompt_tokens"]): r for r in doc["rows"]}
    kinds = list(dict.fromkeys(q["of"] for q in doc["ratios"]))
    rat = {(q["of"], q["prompt_tokens"]): q for q in doc["ratios"]}
    m, s = doc["machine"], doc["settings"]
    lines = [f"raipack bench {doc['package']}", f"{doc['date']}, {m['cores']} cores ({m['cpu']}), load average {m['load_average']}; "
             f"{s['gen_tokens']} generated tokens, {s['warmup']} warm-up + {s['runs']} runs, median (min–max)"]
    lines += [f"  {b}: {next(r['ran_on'] for r in doc['rows'] if r['backend'] == b)}" for b in backends]
    head = ["prompt len"] + [f"{b} {what}" for b in backends for what in ("TTFT ms", "tok/s", "peak MB")]
    for kind in kinds:
        suffix = "" if len(kinds) == 1 else f" {kind}"
        head += [f"TTFT ×{suffix}", f"tok/s ×{suffix}", f"peak ×{suffix}"]
    table = [head]
    for n in s["lengths"]:
        row = [str(n)]
        for b in backends:
            r = by.get((b, n))
            row += [_cell(r["ttft_ms"]), _cell(r["tokens_per_s"]), f"{r['peak_rss_mb']:.0f}"] if r else ["-", "-", "-"]
        for kind in kinds:
            q = rat.get((kind, n), {})
            row += [_x(q.get("ttft")), _x(q.get("tokens_per_s")), _x(q.get("peak_rss"))]
        table.append(row)
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines += ["", *("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in table)]
    for kind in kinds:
        label = "×" if len(kinds) == 1 else f"× {kind}"
        first = "the package" if kind == "reference/oga" else kind.split("/")[0]
        lines.append(f"{label} = {kind}, the ratio of the medians (TTFT below 1 and tok/s above 1: {first} is faster)")
    lines += [f"note: {n}" for n in doc.get("notes", [])]
    return "\n".join(lines) + "\n"


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}"
