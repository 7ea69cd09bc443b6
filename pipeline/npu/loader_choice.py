"""Which onnxruntime-genai version reads a package's genai_config.json, and why that one."""

from __future__ import annotations

from dataclasses import dataclass

from raipack.core.package import Package
from raipack.npu import catalog
from raipack.npu.loader_config import grammar_for
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


def loader_for(pkg: Package, profile: Profile) -> LoaderChoice:
    amd = profile.target in AMD_TARGETS
    wanted, why = _wanted(pkg, profile)
    version, _how = grammar_for(wanted)
    if wanted is None:
        why = f"{why}; judged with the newest loader raipack knows"
    return LoaderChoice(version, amd, wanted, why)


def _wanted(pkg: Package, profile: Profile) -> tuple[str | None, str]:
    entry = catalog.entry(profile.release) if profile.release not in ("n/a", "") else None
    if entry is not None:
        if entry.get("onnxruntime_genai"):
            return entry["onnxruntime_genai"], f"Ryzen AI {profile.release}'s loader"
        older = [r for r in catalog.releases() if r.get("onnxruntime_genai") and catalog.version_key(r["release"]) <= catalog.version_key(profile.release)]
        if older:
            rel = older[-1]
            return rel["onnxruntime_genai"], f"Ryzen AI {profile.release}'s loader is not recorded; {rel['release']}'s"
        return None, f"Ryzen AI {profile.release}'s loader is not recorded"
    built = _manifest_version(pkg)
    if built:
        return built, "the version raipack's manifest records"
    return None, "no release names this folder's loader"


def _manifest_version(pkg: Package) -> str | None:
    doc = pkg.try_json("manifest.json")
    tools = doc.get("tools") if isinstance(doc, dict) else None
    version = tools.get("onnxruntime-genai") if isinstance(tools, dict) else None
    return version if isinstance(version, str) else None
