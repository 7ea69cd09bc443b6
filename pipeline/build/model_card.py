"""The numbers of a build, appended to the package's README model card."""

from __future__ import annotations

from pathlib import Path

MARK = "\n## Build record\n"


def build_section(report: dict) -> str:
    lines = [MARK, f"Built by raipack for profile `{report['profile']}` in {report['seconds']:.0f} s.", "",
             "| stage | status | seconds | summary |", "|---|---|---|---|"]
    for s in report["stages"]:
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:.1f} | {s['report'].get('summary', '')} |")
    quality = []
    for s in report["stages"]:
        for k, v in (s["report"].get("quality") or {}).items():
            quality.append(f"| {s['name']} | {k} | {v} |")
    if quality:
        lines += ["", "| stage | measure | value |", "|---|---|---|"] + quality
    lines += ["", "Tools: " + ", ".join(f"{k} {v}" for k, v in report["tools"].items()), ""]
    return "\n".join(lines)


def append_build_numbers(readme: Path, report: dict) -> None:
    text = readme.read_text("utf-8") if readme.exists() else f"# {report['model']}\n"
    text = text.split(MARK)[0].rstrip("\n") + "\n" + build_section(report)
    readme.write_text(text, "utf-8")
