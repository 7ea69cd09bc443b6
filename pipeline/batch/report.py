"""What raipack batch prints and writes: one line per finished job, a summary table, and the
json or junit report (one test case per matrix entry)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

STATUS_ORDER = ("built", "cached", "failed", "skipped")


def job_line(task) -> str:
    """`quantize  tiny@1.8.0-npu-4K (+1 entry)  built  3.2 s`: one finished stage job."""
    status = "failed" if task.error is not None else task.result["status"]
    shared = f" (+{len(task.entries) - 1} {'entry' if len(task.entries) == 2 else 'entries'})" if len(task.entries) > 1 else ""
    line = f"{task.stage:<9} {task.entries[0]}{shared}  {status}  {task.seconds:.1f} s"
    return line + (f": {task.error}" if task.error else "") + (f"\n  hint: {task.hint}" if task.error and task.hint else "")


def table(entries: list[dict], counts: dict[str, int], model_packages: dict | None = None) -> str:
    """The summary: one row per entry (and per assembled model package), then the jobs per stage against
    the entries they served."""
    rows = [("entry", "status", "package / error")] + [(e["entry"], e["status"], e["package"] or e["error"] or "") for e in entries]
    rows += [(f"{model} (model package)", m["status"], m["package"] or m["error"] or "") for model, m in (model_packages or {}).items()]
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = [f"{r[0]:<{width[0]}}  {r[1]:<{width[1]}}  {r[2]}" for r in rows]
    tally = {s: sum(1 for e in entries if e["status"] == s) for s in STATUS_ORDER}
    lines.append(f"{len(entries)} entries: " + ", ".join(f"{n} {s}" for s, n in tally.items() if n))
    lines.append("jobs: " + ", ".join(f"{n} {stage}" for stage, n in counts.items()) + f" (for {len(entries)} entries)")
    return "\n".join(lines)


def document(matrix: str, entries: list[dict], counts: dict[str, int], seconds: float) -> dict:
    return {"format": "raipack-batch-report", "format_version": 1, "matrix": matrix, "seconds": round(seconds, 2),
            "jobs": counts, "entries": entries}


def to_json(doc: dict) -> str:
    return json.dumps(doc, indent=2) + "\n"


def to_junit(doc: dict) -> str:
    """One <testcase> per matrix entry: a failed entry is a <failure> with its error, a skipped one <skipped>."""
    entries = doc["entries"]
    suite = ET.Element("testsuite", name="raipack batch", tests=str(len(entries)), time=f"{doc['seconds']:.2f}",
                       failures=str(sum(e["status"] == "failed" for e in entries)), skipped=str(sum(e["status"] == "skipped" for e in entries)))
    for e in entries:
        seconds = sum(s.get("seconds") or 0 for s in e["stages"])
        case = ET.SubElement(suite, "testcase", classname=f"raipack.batch.{e['model']}", name=e["entry"], time=f"{seconds:.2f}")
        if e["status"] == "failed":
            ET.SubElement(case, "failure", message=e["error"] or "failed").text = e["error"] + (f"\nhint: {e['hint']}" if e.get("hint") else "")
        elif e["status"] == "skipped":
            ET.SubElement(case, "skipped", message=e["error"] or "skipped")
        else:
            ET.SubElement(case, "system-out").text = f"{e['status']}: {e['package']}"
    return ET.tostring(ET.ElementTree(suite).getroot(), encoding="unicode", xml_declaration=True) + "\n"
