"""Small helpers the tests share for editing generated packages."""

from __future__ import annotations

import json
from pathlib import Path


def edit_json(path: Path, fn) -> None:
    doc = json.loads(Path(path).read_text())
    result = fn(doc)
    Path(path).write_text(json.dumps(doc if result is None else result, indent=2))


def ryzen(doc: dict) -> dict:
    """The RyzenAI options block of a 1.7+ genai_config (for editing)."""
    return doc["model"]["decoder"]["session_options"]["provider_options"][0]["RyzenAI"]


def ids(result) -> set[str]:
    return {f.check_id for f in result.findings if f.severity == "error"}
