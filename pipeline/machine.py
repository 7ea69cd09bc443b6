"""What this machine has for running a package on the Ryzen AI NPU, read without trusting the current folder:
the installed runtime's versions (the distributions' metadata, over `sys.path` minus the current folder;
nothing is imported), matched to a Ryzen AI release by pipeline/data/ryzenai_releases.json.

Used by `raipack doctor` (pipeline/doctor.py). Whether the NPU can run a package here (provider library,
its loading, onnxruntime-genai's RyzenAI provider, the NPU and its driver) is
pipeline/runtime/readiness.py's answer, the same smoke, bench and eval get.
"""

from __future__ import annotations

import importlib.metadata

from raipack.npu import catalog
from raipack.runtime import probes


def releases() -> dict:
    """The release catalog (raipack.npu.catalog: the shipped file, or the one RAIPACK_RELEASES names)."""
    return catalog.load()


def installed(kind: str) -> tuple[str, str] | None:
    """(distribution name, version) of the first installed distribution of `kind`
    (onnxruntime_genai | onnxruntime) the release map lists, else None."""
    path = probes.search_path()
    for name in releases()["distributions"][kind]:
        for dist in importlib.metadata.distributions(name=name, path=path):
            return name, dist.version
    return None


def release_of(genai_version: str | None) -> dict | None:
    """The release entry whose onnxruntime-genai is `genai_version` (None if no release's is)."""
    return next((r for r in releases()["releases"] if genai_version and r["onnxruntime_genai"] == genai_version), None)


def release_entry(release: str) -> dict | None:
    """The release map's entry of `release` ("1.8.0"; "1.3" matches "1.3")."""
    entries = releases()["releases"]
    return next((r for r in entries if r["release"] == release), None) or next((r for r in entries if r["release"].startswith(release + ".")), None)
