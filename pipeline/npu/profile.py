"""Load profiles and detect which one a package follows."""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from raipack.core.errors import UsageError
from raipack.core.package import Package
from raipack.npu.genai import ryzenai_options

PROFILE_PACKAGE = "raipack.profiles"


def merge(base: dict, over: dict) -> dict:
    """`over` merged into a copy of `base`: objects key by key, anything else replaced."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def raw_profiles() -> dict[str, dict]:
    """The profile files as written (a derived profile holds only what differs from its base)."""
    out = {}
    for entry in sorted(resources.files(PROFILE_PACKAGE).iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            data = json.loads(entry.read_text("utf-8"))
            out[data["id"]] = data
    return out


@lru_cache(maxsize=None)
def all_profiles() -> dict[str, dict]:
    """Every profile with `extends` resolved."""
    raw = raw_profiles()

    def resolve(pid: str, seen: tuple = ()) -> dict:
        if pid in seen:
            raise RuntimeError(f"profile {pid} extends itself through {' → '.join(seen)}")
        doc = raw[pid]
        if "extends" not in doc:
            return doc
        return merge(resolve(doc["extends"], seen + (pid,)), doc)

    return {pid: resolve(pid) for pid in raw}


def for_model(profile: dict, model_type: str | None) -> dict:
    """The profile as it applies to one model family (its `model_overrides` entry merged in)."""
    over = (profile.get("model_overrides") or {}).get(model_type or "")
    return merge(profile, over) if over else profile


def reference_for(target: dict) -> dict:
    """raipack's reference profile for an AMD release profile (the one that extends it)."""
    if target["target"] == "reference":
        return target
    for prof in all_profiles().values():
        if prof["target"] == "reference" and prof.get("extends") == target["id"]:
            return prof
    raise UsageError(f"profile {target['id']} has no reference profile, so raipack cannot build it",
                     "build one of: " + ", ".join(p["extends"] for p in all_profiles().values() if p["target"] == "reference" and p.get("extends")))


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


def built_by_raipack(pkg: Package) -> Detection | None:
    """The reference profile whose markers hold: manifest.json says raipack built this package, and
    for which target. Such a package must carry raipack's own NPU formats (RP901 holds it to that)."""
    best: dict | None = None
    best_conds: list[dict] = []
    for prof in all_profiles().values():
        conds = prof["detect"]["content"]
        if prof["target"] == "reference" and len(conds) > len(best_conds) and all(condition_holds(pkg, c) for c in conds):
            best, best_conds = prof, conds
    if best:
        return Detection(best, "; ".join(c.get("why", "marker holds") for c in best_conds))
    return _by_reference_header(pkg)


def _by_reference_header(pkg: Package) -> Detection | None:
    """Without raipack's manifest (a copy that lost it), raipack's own model.pb.bin still says which
    reference profile it was fused for; RP901 then reports the missing manifest under that profile."""
    from raipack.npu import formats
    from raipack.npu.layout import package_files

    headers = sorted({package_files(p)["header"] for p in all_profiles().values() if p["target"] == "reference"})
    name = next((h for h in headers if h in pkg.files and formats.is_reference_header(pkg.root / h)), None)
    if name is None:
        return None
    try:
        profile_id = formats.read_header(pkg.root / name).get("profile")
    except (formats.FormatError, OSError):
        return None
    prof = all_profiles().get(profile_id) if isinstance(profile_id, str) else None
    if prof is None or prof["target"] != "reference":
        return None
    return Detection(prof, f"{name} is raipack's reference header, fused for profile {profile_id} (there is no raipack manifest)")


def detect(pkg: Package) -> Detection | None:
    """The profile whose name pattern or content markers fit the package best.

    A raipack manifest wins over the folder name (raipack names its packages
    like AMD's); then the folder name; then the profile with the most content
    markers that all hold.
    """
    raipack = built_by_raipack(pkg)
    if raipack is not None:
        return raipack
    profiles = all_profiles()
    best, best_score, best_why = None, 0, []
    for prof in profiles.values():
        conds = prof["detect"]["content"]
        if prof["target"] != "reference" and conds and len(conds) > best_score and all(condition_holds(pkg, c) for c in conds):
            best, best_score, best_why = prof, len(conds), [c.get("why", "marker holds") for c in conds]
    for prof in profiles.values():
        for pattern in prof["detect"]["name_patterns"]:
            if fnmatch.fnmatchcase(pkg.name, pattern):
                return Detection(prof, f"the folder name {pkg.name!r} matches {pattern!r}")
    if best is not None:
        return Detection(best, "; ".join(best_why))
    return None
