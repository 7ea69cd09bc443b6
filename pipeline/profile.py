"""Load profiles and detect which one a package follows."""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from .errors import UsageError
from .genai import ryzenai_options
from .package import Package

PROFILE_PACKAGE = "pipeline.profiles"


@lru_cache(maxsize=None)
def all_profiles() -> dict[str, dict]:
    out = {}
    for entry in sorted(resources.files(PROFILE_PACKAGE).iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            data = json.loads(entry.read_text("utf-8"))
            out[data["id"]] = data
    return out


def get(profile_id: str) -> dict:
    profiles = all_profiles()
    if profile_id not in profiles:
        raise UsageError(
            f"--profile {profile_id!r} is not a known profile",
            f"choose one of: auto, {', '.join(profiles)}",
        )
    return profiles[profile_id]


@dataclass
class Detection:
    profile: dict
    reason: str


_MISSING = object()


def _pointer_get(doc, pointer: str):
    node = doc
    for part in pointer.lstrip("/").split("/") if pointer not in ("", "/") else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def condition_holds(pkg: Package, cond: dict) -> bool:
    """Evaluate one detection condition (shape in schemas/profile.schema.json)."""
    if "exists" in cond and "file" not in cond:
        return any(fnmatch.fnmatchcase(rel, cond["exists"]) for rel in pkg.files) or cond["exists"] in pkg.dirs
    if "absent" in cond:
        return not any(fnmatch.fnmatchcase(rel, cond["absent"]) for rel in pkg.files)
    if "ryzenai" in cond:
        opts, _ = ryzenai_options(pkg.try_json("genai_config.json"))
        return opts.get(cond["ryzenai"], _MISSING) == cond["equals"]
    value = _pointer_get(pkg.try_json(cond["file"]), cond["pointer"])
    if "exists" in cond:
        return (value is not _MISSING) == cond["exists"]
    if value is _MISSING:
        return False
    if "equals" in cond:
        return value == cond["equals"]
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    if "gt" in cond:
        return value > cond["gt"]
    return value <= cond["le"]


def detect(pkg: Package) -> Detection | None:
    """The profile whose name pattern or content markers fit the package best.

    A raipack manifest wins over the folder name (raipack names its packages
    like AMD's); then the folder name; then the profile with the most content
    markers that all hold.
    """
    profiles = all_profiles()
    best, best_score, best_why = None, 0, []
    for prof in profiles.values():
        conds = prof["detect"]["content"]
        if conds and all(condition_holds(pkg, c) for c in conds):
            score = len(conds) + (100 if prof["target"] == "reference" else 0)
            if score > best_score:
                best, best_score, best_why = prof, score, [c.get("why", "marker holds") for c in conds]
    if best is not None and best["target"] == "reference":
        return Detection(best, "; ".join(best_why))
    for prof in profiles.values():
        for pattern in prof["detect"]["name_patterns"]:
            if fnmatch.fnmatchcase(pkg.name, pattern):
                return Detection(prof, f"the folder name {pkg.name!r} matches {pattern!r}")
    if best is not None:
        return Detection(best, "; ".join(best_why))
    return None
