"""The machine-readable report (schemas/report.schema.json)."""

from __future__ import annotations

import json

from raipack import __version__
from raipack.core.textsafe import safe_results


def report_dict(results, exit_code: int) -> dict:
    return {
        "tool": {"name": "raipack", "version": __version__},
        "results": [r.to_dict() for r in safe_results(results)],
        "exit_code": exit_code,
    }


def render(results, exit_code: int, color: bool = False) -> str:
    return json.dumps(report_dict(results, exit_code), indent=2) + "\n"
