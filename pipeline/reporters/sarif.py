"""SARIF 2.1.0 for code-scanning dashboards."""

from __future__ import annotations

import json
import os
from urllib.parse import quote

from raipack import __version__
from raipack.checks import load_all
from raipack.core.textsafe import PATH_LIMIT, safe, safe_finding

LEVEL = {"error": "error", "warning": "warning", "advice": "note", "info": "none"}


def render(results, exit_code: int, color: bool = False, root: str | None = None) -> str:
    """`root`: the repository a code-scanning service reads the log for (GitHub's upload-sarif ignores
    `originalUriBaseIds` and reads every `uri` as relative to the repository, github/codeql-action #2215):
    locations of packages under it are written relative to it (base SRCROOT), the others as before (base PKG)."""
    specs = load_all()
    rules = [{"id": s.id, "name": s.name, "shortDescription": {"text": s.doc.split(".")[0][:200]}, "fullDescription": {"text": s.doc}, "defaultConfiguration": {"level": LEVEL[s.severity]}} for s in specs.values()]
    runs = []
    for r in results:
        bases = {"PKG": {"uri": _uri(os.path.abspath(r.root).rstrip("/") + "/", "file://")}}
        prefix = _under(r.root, root)
        if prefix is not None:
            bases["SRCROOT"] = {"uri": _uri(os.path.abspath(root).rstrip("/") + "/", "file://")}
        runs.append({
            "tool": {"driver": {"name": "raipack", "version": __version__, "rules": rules}},
            "originalUriBaseIds": bases,
            "properties": {"profile": safe(r.profile), "profileReason": safe(r.profile_reason)},
            "results": [_result(f, prefix) for f in r.findings],
        })
    return json.dumps({"version": "2.1.0", "$schema": "https://json.schemastore.org/sarif-2.1.0.json", "runs": runs}, indent=2) + "\n"


def _under(package_root: str, root: str | None) -> str | None:
    """The package's folder relative to `root` ("" for root itself), None when it is not under it."""
    if root is None:
        return None
    pkg, base = os.path.realpath(package_root), os.path.realpath(root)
    if os.path.commonpath([pkg, base]) != base:
        return None
    rel = os.path.relpath(pkg, base)
    return "" if rel == "." else rel.replace(os.sep, "/") + "/"


def _result(raw, prefix: str | None = None) -> dict:
    f = safe_finding(raw)
    location = {"uri": _uri(raw.path) or ".", "uriBaseId": "PKG"} if prefix is None else {"uri": _uri(prefix + raw.path) or ".", "uriBaseId": "SRCROOT"}
    return {
        "ruleId": f.check_id,
        "level": LEVEL[f.severity],
        "message": {"text": f"{f.message}. Hint: {f.hint}" if f.hint else f.message},
        "locations": [{"physicalLocation": {"artifactLocation": location}, **({"logicalLocations": [{"fullyQualifiedName": f.pointer}]} if f.pointer else {})}],
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
