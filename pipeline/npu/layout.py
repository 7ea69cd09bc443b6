"""How a package names its files: dd_metastate sets and their tiers, the NPU weights beside their
header, paths that stay inside the package."""

from __future__ import annotations

import re
from collections import defaultdict

PREFIX = "dd_metastate_"
TIERED = re.compile(r"^dd_metastate_Llm_(?P<phase>Prefill|Token)_(?P<node>.+)_(?P<tier>\d+)$")


NPU_FILES = {"graph": "model.onnx", "data": "model.onnx.data", "header": "model.pb.bin"}  # a profile without `layout`


def package_files(profile) -> dict[str, str]:
    """The decoder graph, its CPU-side data, the NPU weights header and its weights file a profile's
    layout names (its `layout`; the NPU packages' model.* where it has none)."""
    names = {k: getattr(profile.layout, k) or v for k, v in NPU_FILES.items()}
    names["weights"] = weights_sibling(names["header"])
    return names


def weights_sibling(header: str) -> str:
    """model.pb.bin → model.bin; model_jit.pb.bin → model_jit.bin."""
    return header[: -len(".pb.bin")] + ".bin" if header.endswith(".pb.bin") else header + ".bin"


def is_inside(value: str) -> bool:
    """A relative path that stays inside the package: no `..`, no absolute path, no drive letter."""
    norm = value.replace("\\", "/")
    return not (norm.startswith("/") or (len(norm) > 1 and norm[1] == ":") or ".." in norm.split("/"))


def metastate_sets(pkg) -> dict[str, dict[str, str]]:
    """stem (folder + name without extension) → extension → relative path."""
    sets: dict[str, dict[str, str]] = defaultdict(dict)
    for rel in pkg.files:
        name = rel.rsplit("/", 1)[-1]
        if name.startswith(PREFIX) and "." in name:
            stem, ext = rel.rsplit(".", 1)
            sets[stem][ext] = rel
    return dict(sets)


def tiers_present(pkg) -> dict[str, dict[str, set[int]]]:
    """phase (Prefill/Token) → node → tiers found in tiered file names.

    Only meaningful for tiered layouts: AMD's own names end in `_<n>_<m>`
    node indices that look like tiers."""
    out: dict[str, dict[str, set[int]]] = {"Prefill": defaultdict(set), "Token": defaultdict(set)}
    for stem in metastate_sets(pkg):
        m = TIERED.match(stem.rsplit("/", 1)[-1])
        if m:
            out[m["phase"]][m["node"]].add(int(m["tier"]))
    return out
