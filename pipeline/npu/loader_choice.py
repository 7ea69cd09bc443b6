"""Which onnxruntime-genai version reads a package's genai_config.json, and why that one."""

from __future__ import annotations

import json
from dataclasses import dataclass

from raipack.core.package import Package
from raipack.npu import catalog
from raipack.npu.loader_config import grammar_for, judge
from raipack.npu.spec import Profile

AMD_TARGETS = ("npu", "hybrid", "reference")  # read by AMD's runtime build (raipack's reference packages copy its layout)


@dataclass(frozen=True)
class LoaderChoice:
    version: str  # the generated grammar used
    amd: bool  # AMD's build of it (pipeline/data/oga/amd_runtime.json applies)
    wanted: str | None  # the version the package is for, when known
    why: str  # where `wanted` comes from

    def describe(self) -> str:
        who = f"onnxruntime-genai {self.version}" + (", AMD's build," if self.amd else "")
        if self.wanted and self.wanted != self.version:
            return f"{who}, the nearest version raipack knows to {self.wanted} ({self.why}),"
        return f"{who} ({self.why})"


def for_release(profile: Profile) -> LoaderChoice | None:
    """The loader of the profile's Ryzen AI release, None for a profile of no release (an export)."""
    if profile.release in ("n/a", "") or catalog.entry(profile.release) is None:
        return None
    wanted, why = _wanted(None, profile)
    return LoaderChoice(grammar_for(wanted)[0], profile.target in AMD_TARGETS, wanted, why)


def fit(genai: dict, choice: LoaderChoice) -> tuple[dict, list[str]]:
    """`genai` without the keys `choice`'s loader does not know (an export by a newer model builder
    writes keys an older release's loader refuses: 0.18's sliding_window.cache_slack, say), and the
    JSON pointers removed. Other refusals stay for RP204 to report."""
    doc = json.loads(json.dumps(genai))
    removed: list[str] = []
    for _ in range(64):
        refusals = judge(json.dumps(doc, ensure_ascii=False).encode(), choice.version, amd=choice.amd)
        unknown = next((r for r in refusals if "Unknown value" in r.message and r.pointer), None)
        if unknown is None or not _remove(doc, unknown.pointer):
            break
        removed.append(unknown.pointer)
    return doc, removed


def _remove(doc, pointer: str) -> bool:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.strip("/").split("/")]
    node = doc
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node.get(part) if isinstance(node, dict) else None
        if node is None:
            return False
    if isinstance(node, dict) and parts[-1] in node:
        del node[parts[-1]]
        return True
    return False


def loader_for(pkg: Package, profile: Profile) -> LoaderChoice:
    amd = profile.target in AMD_TARGETS
    wanted, why = _wanted(pkg, profile)
    version, _how = grammar_for(wanted)
    if wanted is None:
        why = f"{why}; judged with the newest loader raipack knows"
    return LoaderChoice(version, amd, wanted, why)


def _wanted(pkg: Package | None, profile: Profile) -> tuple[str | None, str]:
    entry = catalog.entry(profile.release) if profile.release not in ("n/a", "") else None
    if entry is not None:
        if entry.get("onnxruntime_genai"):
            return entry["onnxruntime_genai"], f"Ryzen AI {profile.release}'s loader"
        older = [r for r in catalog.releases() if r.get("onnxruntime_genai") and catalog.version_key(r["release"]) <= catalog.version_key(profile.release)]
        if older:
            rel = older[-1]
            return rel["onnxruntime_genai"], f"Ryzen AI {profile.release}'s loader is not recorded; {rel['release']}'s"
        return None, f"Ryzen AI {profile.release}'s loader is not recorded"
    built = _manifest_version(pkg) if pkg is not None else None
    if built:
        return built, "the version raipack's manifest records"
    return None, "no release names this folder's loader"


def _manifest_version(pkg: Package) -> str | None:
    doc = pkg.try_json("manifest.json")
    tools = doc.get("tools") if isinstance(doc, dict) else None
    version = tools.get("onnxruntime-genai") if isinstance(tools, dict) else None
    return version if isinstance(version, str) else None
