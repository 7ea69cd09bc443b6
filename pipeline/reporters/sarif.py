"""SARIF 2.1.0 for code-scanning dashboards."""

from __future__ import annotations

import json

from .. import __version__
from ..checks import load_all

LEVEL = {"error": "error", "warning": "warning", "advice": "note", "info": "none"}


def render(results, exit_code: int, color: bool = False) -> str:
    specs = load_all()
    rules = [{"id": s.id, "name": s.name, "shortDescription": {"text": s.doc.split(".")[0][:200]}, "fullDescription": {"text": s.doc}, "defaultConfiguration": {"level": LEVEL[s.severity]}} for s in specs.values()]
    runs = []
    for r in results:
        runs.append({
            "tool": {"driver": {"name": "raipack", "version": __version__, "rules": rules}},
            "originalUriBaseIds": {"PKG": {"uri": r.root.rstrip("/") + "/"}},
            "properties": {"profile": r.profile, "profileReason": r.profile_reason},
            "results": [{
                "ruleId": f.check_id,
                "level": LEVEL[f.severity],
                "message": {"text": f"{f.message}. Hint: {f.hint}" if f.hint else f.message},
                "locations": [{"physicalLocation": {"artifactLocation": {"uri": f.path or ".", "uriBaseId": "PKG"}}, **({"logicalLocations": [{"fullyQualifiedName": f.pointer}]} if f.pointer else {})}],
            } for f in r.findings],
        })
    return json.dumps({"version": "2.1.0", "$schema": "https://json.schemastore.org/sarif-2.1.0.json", "runs": runs}, indent=2) + "\n"
