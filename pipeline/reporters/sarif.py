"""SARIF 2.1.0 for code-scanning dashboards."""

from __future__ import annotations

import json
import os
from urllib.parse import quote

from raipack import __version__
from raipack.checks import load_all
from raipack.core.textsafe import PATH_LIMIT, safe, safe_finding

LEVEL = {"error": "error", "warning": "warning", "advice": "note", "info": "none"}


def render(results, exit_code: int, color: bool = False) -> str:
    specs = load_all()
    rules = [{"id": s.id, "name": s.name, "shortDescription": {"text": s.doc.split(".")[0][:200]}, "fullDescription": {"text": s.doc}, "defaultConfiguration": {"level": LEVEL[s.severity]}} for s in specs.values()]
    runs = []
    for r in results:
        runs.append({
            "tool": {"driver": {"name": "raipack", "version": __version__, "rules": rules}},
            "originalUriBaseIds": {"PKG": {"uri": _uri(os.path.abspath(r.root).rstrip("/") + "/", "file://")}},
            "properties": {"profile": safe(r.profile), "profileReason": safe(r.profile_reason)},
            "results": [_result(f) for f in r.findings],
        })
    return json.dumps({"version": "2.1.0", "$schema": "https://json.schemastore.org/sarif-2.1.0.json", "runs": runs}, indent=2) + "\n"


def _result(raw) -> dict:
    f = safe_finding(raw)
    return {
        "ruleId": f.check_id,
        "level": LEVEL[f.severity],
        "message": {"text": f"{f.message}. Hint: {f.hint}" if f.hint else f.message},
        "locations": [{"physicalLocation": {"artifactLocation": {"uri": _uri(raw.path) or ".", "uriBaseId": "PKG"}}, **({"logicalLocations": [{"fullyQualifiedName": f.pointer}]} if f.pointer else {})}],
        **({"properties": {"members": list(f.members)}} if f.members else {}),
    }


def _uri(path: str, scheme: str = "") -> str:
    """A file name as a URI reference: its bytes percent-encoded (exact, even
    for names that are not UTF-8)."""
    try:
        raw = os.fsencode(path)
    except UnicodeError:
        raw = path.encode("utf-8", "surrogatepass")
    return scheme + quote(raw, safe="/")[: 3 * PATH_LIMIT]
