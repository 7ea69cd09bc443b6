"""Text for people: the detected profile, findings grouped by file, a verdict."""

from __future__ import annotations

from collections import defaultdict

from raipack.core.textsafe import safe_results

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
            for f in by_file[path]:
                where = f" [{f.pointer}]" if f.pointer else ""
                out.append(f"    {_paint(f.severity, f.severity, color)} {f.check_id} {f.message}{where}")
                if f.hint:
                    out.append(f"      hint: {f.hint}")
        counts = ", ".join(f"{r.count(s)} {s}{'s' if r.count(s) != 1 else ''}" for s in ("error", "warning", "advice") if r.count(s))
        verdict = "FAIL" if r.failed() else "ok"
        out.append(f"  {_paint(verdict, 'error' if verdict == 'FAIL' else 'info', color) if color else verdict}: {r.files} files, {len(r.checks_run)} checks, {counts or 'no findings'} in {r.seconds:.2f} s")
    return "\n".join(out) + "\n"
