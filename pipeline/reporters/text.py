"""Text for people: the detected profile, findings grouped by file, a verdict."""

from __future__ import annotations

from collections import defaultdict

from raipack.core.textsafe import safe_results

CAP = 5  # findings of one rule and severity printed per file; json and sarif keep all
COLORS = {"error": "31", "warning": "33", "advice": "36", "info": "2"}


def _paint(text: str, severity: str, color: bool) -> str:
    return f"\033[{COLORS[severity]}m{text}\033[0m" if color else text


def render(results, exit_code: int, color: bool = False) -> str:
    out = []
    for r in safe_results(results):
        out.append(f"{r.root}: profile {r.profile} ({r.profile_reason})")
        by_file = defaultdict(list)
        for f in r.findings:
            by_file[f.path].append(f)
        for path in sorted(by_file):
            out.append(f"  {path or '(package)'}")
            for f, more in _capped(by_file[path]):
                if more:
                    out.append(f"    … {more} more {f.check_id} {f.severity}s on this file (the json and sarif reports list every one)")
                    continue
                where = f" [{f.pointer}]" if f.pointer and not f.members else ""
                out.append(f"    {_paint(f.severity, f.severity, color)} {f.check_id} {f.message}{where}")
                if f.hint:
                    out.append(f"      hint: {f.hint}")
        counts = ", ".join(f"{r.count(s)} {s}{'s' if r.count(s) != 1 else ''}" for s in ("error", "warning", "advice") if r.count(s))
        verdict = "FAIL" if r.failed() else "ok"
        out.append(f"  {_paint(verdict, 'error' if verdict == 'FAIL' else 'info', color) if color else verdict}: {r.files} files, {len(r.checks_run)} checks, {counts or 'no findings'} in {r.seconds:.2f} s")
    return "\n".join(out) + "\n"


def _capped(findings):
    """(finding, 0) for each finding to print; past CAP findings of one rule and severity on a
    file, one (finding, how many more) line instead of the rest."""
    seen: dict[tuple[str, str], int] = defaultdict(int)
    for f in findings:
        seen[f.check_id, f.severity] += 1
    shown: dict[tuple[str, str], int] = defaultdict(int)
    for f in findings:
        key = (f.check_id, f.severity)
        shown[key] += 1
        if shown[key] <= CAP:
            yield f, 0
        elif shown[key] == CAP + 1:
            yield f, seen[key] - CAP
