"""The report's data: what a build recorded (report.json), what validation and `raipack inspect` say
about the package, and the bench / eval results beside it. Plain dicts; rendering is page.py's."""

from __future__ import annotations

from pathlib import Path

from raipack.report import chain, inputs
from raipack.summary import summary
from raipack.validate import validate


def page_data(name: str, summary: dict, findings: list[dict], report: dict | None = None, bench: dict | None = None, evaluation: dict | None = None) -> dict:
    """Everything the page shows, from the already-read inputs."""
    stages = (report or {}).get("stages") or []
    return {
        "name": name,
        "model": (report or {}).get("model"),
        "profile": summary.get("profile"),
        "profile_reason": summary.get("profile_reason"),
        "runs_on": summary.get("runs_on"),
        "build_seconds": (report or {}).get("seconds"),
        "stages": [{"name": s["name"], "status": s.get("status", ""), "seconds": float(s["seconds"]), "summary": str((s.get("report") or {}).get("summary", ""))} for s in stages],
        "quality": chain.quality_chain(stages),
        "bfp16_changed_answer": chain.answer_change(stages),
        "chain_lines": chain.chain_lines(stages),
        "eval": eval_tables(evaluation),
        "perf": performance(stages, bench),
        "tiers": {"rows": summary.get("tiers") or [], "in_files": {phase.lower(): tiers for phase, tiers in ((summary.get("buckets") or {}).get("tiers_in_files") or {}).items()},  # Prefill -> prefill
                  "profile": (summary.get("buckets") or {}).get("profile_tiers") or {}, "smoke": _smoke(stages).get("tiers") or []},
        "files": summary.get("files") or {},
        "quantization": summary.get("quantization") or {},
        "findings": by_file(findings),
        "counts": {sev: sum(1 for f in findings if f.get("severity") == sev) for sev in ("error", "warning", "advice", "info")},
        "tools": (report or {}).get("tools") or {},
    }


def for_package(path: Path, bench_file: Path | None = None, eval_file: Path | None = None) -> dict:
    """The page data of any package: its report.json when raipack built it, validation and inspect tables,
    and bench.json / eval.json given or found beside it. Bad inputs raise before anything is written."""

    path = Path(path)
    found = {n: path / f"{n}.json" for n in ("report", "bench", "eval") if (path / f"{n}.json").is_file()}
    report = inputs.build_report(found["report"]) if "report" in found else None
    bench = inputs.bench(bench_file or found["bench"]) if bench_file or "bench" in found else None
    evaluation = inputs.evaluation(eval_file or found["eval"]) if eval_file or "eval" in found else None
    result = validate(path)
    summ = summary(path, result.profile)
    summ["profile_reason"] = result.profile_reason
    return page_data(path.resolve().name, summ, [f.to_dict() for f in result.findings], report, bench, evaluation)


def by_file(findings: list[dict]) -> list[dict]:
    """Findings grouped by the file they name, the package's own ("") first."""
    groups: dict[str, list[dict]] = {}
    for f in findings:
        groups.setdefault(str(f.get("path") or ""), []).append(f)
    return [{"path": p or "(the package)", "findings": groups[p]} for p in sorted(groups)]


def eval_tables(doc: dict | None) -> dict | None:
    """Rows of (stage, task, metric, value, stderr, drop) from lm-eval's results or raipack's chain."""
    if not doc:
        return None
    meta = doc.get("raipack") if isinstance(doc.get("raipack"), dict) else {}
    by_numerics = [{"stage": f"{meta.get('kind') or 'package'} ({r['numerics']})", "ran_on": r.get("ran_on"), "results": r["results"], "drop": r.get("drop")}
                   for r in meta.get("rows") or []]
    links = meta.get("chain") or by_numerics or [{"stage": meta.get("kind") or meta.get("target") or "", "results": doc.get("results") or {}}]
    rows = []
    for link in links:
        for task, metrics in sorted(link.get("results", {}).items()):
            for key, value in sorted(metrics.items()):
                if not isinstance(value, (int, float)) or isinstance(value, bool) or "_stderr" in key:
                    continue
                metric = key.split(",")[0]
                stderr = metrics.get(key.replace(metric, f"{metric}_stderr", 1))
                rows.append({"stage": link.get("stage"), "ran_on": link.get("ran_on") or meta.get("ran_on"), "task": task, "metric": metric, "value": value,
                             "stderr": stderr if isinstance(stderr, (int, float)) else None, "drop": _drop(link.get("drop"), task, key)})
    return {"rows": rows, "ran_on": meta.get("ran_on"), "chain": "chain" in meta, "numerics": bool(by_numerics) and "chain" not in meta}


def performance(stages: list[dict], bench: dict | None) -> dict:
    """TTFT and tokens/s against prompt length: bench rows when given, else the smoke stage's per-tier TTFT."""
    if bench:
        series: dict[str, list[dict]] = {}
        for row in bench["rows"]:
            series.setdefault(f"{row['backend']} ({row.get('ran_on', '?')})", []).append(row)
        return {"source": "bench", "series": series, "rows": bench["rows"], "machine": bench.get("machine") or {}, "date": bench.get("date"), "ratios": bench.get("ratios") or []}
    smoke = _smoke(stages)
    ttft = smoke.get("ttft_s") if isinstance(smoke.get("ttft_s"), dict) else {}
    points = [{"prompt_tokens": int(k), "ttft_ms": {"median": float(v) * 1000}} for k, v in ttft.items() if str(k).isdigit() and inputs._number(v)]
    cold = smoke.get("ttft_cold_s") if inputs._number(smoke.get("ttft_cold_s")) else None
    cold_tokens = points[0]["prompt_tokens"] if points else None
    if cold is None and len(points) > 1:  # a report before the warm-up call: its first call (the fixed prompt) was the cold one
        cold, points = points[0]["ttft_ms"]["median"] / 1000, points[1:]
    if not points:
        return {"source": None}
    return {"source": "smoke", "series": {f"{smoke.get('device', 'smoke')} (warm)": points}, "decode_tokens_per_s": smoke.get("decode_tokens_per_s"),
            "device": smoke.get("device"), "cold": {"prompt_tokens": cold_tokens, "ttft_s": cold} if cold is not None else None}


def _smoke(stages: list[dict]) -> dict:
    for s in stages:
        rep = s.get("report") or {}
        if "ttft_s" in rep or "tiers" in rep and "device" in rep:
            return rep
    return {}


def _drop(drop, task: str, key: str):
    """The drop against the source: raipack eval's {task: {metric key: {"vs_source": ...}}}, or a plain number."""
    for step in (task, key, "vs_source"):
        if isinstance(drop, dict):
            drop = drop.get(step)
    return drop if inputs._number(drop) else None
