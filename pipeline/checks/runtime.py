"""The files an NPU package's runtime opens, checked whether or not raipack built the package.

A package in AMD's own layout has no raipack manifest, so nothing records its files' digests: what the
runtime needs is derived from the profile (its required files and metastate layout), from
`pipeline/data/runtime_files.json` (files the runtime opens by name, with where each is known from) and
from the package's own meta files. Sizes against a meta file's `file_size` are RP603's.
"""

from __future__ import annotations

import fnmatch

from raipack.checks.base import check
from raipack.data import load_data
from raipack.npu.layout import PREFIX, metastate_sets
from raipack.npu.target import Target

COPY = "copy the complete package again (all files of the release)"


def _rules() -> dict:
    return load_data("runtime_files.json")


def _cache_dir(ctx) -> str | None:
    return next((d for d in ("cache", ".cache") if d in ctx.pkg.dirs), None)


def _opened(ctx) -> list[str]:
    spec = ctx.profile.files
    names = [*spec.required, *spec.recommended, *(p for g in spec.required_one_of for p in g)]
    names += _rules()["opens_as_files"]["patterns"]
    return [n for n in dict.fromkeys(names) if n not in ("cache", ".cache") and not any(c in n for c in "*?[")]


@check("RP111", "runtime-files")
def runtime_files(ctx):
    """Every file the runtime opens is a file (any package). A folder where the runtime opens
    a file (`model.bin`, `tokenizer_config.json`, a `dd_metastate_*` member)
    fails the load: onnxruntime-genai and its tokenizer open these by name,
    and the NPU runtime opens a metastate file it finds instead of compiling
    it again. A release's own extra files are required by name
    (`pipeline/data/runtime_files.json`: `cache/txn_bins.zip` of the 1.7.1 and
    1.8 NPU layouts, which every published 1.8 package carries, the AMD package facts
    §1 [V3]) of a package in AMD's layout (not one raipack built, whose own
    formats name their files: RP901–RP905). Each dd_metastate node of an AMD layout has its
    `cache/<node>_meta.json`, the node's tensor map (AMD's 1.6 NPU packages pair
    `dd_metastate_Llm_Token_MatMulNBits_2_0.*` with
    `.cache/MatMulNBits_2_0_meta.json`, §1 [V]; §6 and AMD's VAIP pass
    `prepare_metadata.cpp` write `tensor_map` with `file_name`/`file_size`).
    A node without the phase set other nodes have is a warning: the runtime
    compiles and writes a missing state at first load, slowly (§6 [V]).
    Not checked, for want of evidence: how far AMD's own `model.pb.bin`
    reaches into `model.bin` (its format is not published; raipack's own
    header is RP901's)."""
    for rel in _opened(ctx):
        if rel in ctx.pkg.dirs:
            yield ctx.finding(rel, "is a folder, but the runtime opens it as a file", COPY)
    for d in sorted(ctx.pkg.dirs):
        if d.rsplit("/", 1)[-1].startswith(PREFIX):
            yield ctx.finding(d, "is a folder, but the NPU runtime opens it as a dd_metastate file", COPY)
    if _raipack_layout(ctx):
        return  # raipack's own formats name their files themselves (RP901–RP905)
    cache = _cache_dir(ctx) or "cache"
    for extra in _rules()["extra"]:
        if any(fnmatch.fnmatchcase(ctx.profile.id, p) for p in extra["profiles"]):
            rel = extra["file"].format(cache=cache)
            if rel not in ctx.pkg.files:
                yield ctx.finding(rel, f"is missing: profile {ctx.profile.id} packages carry it ({extra['why'].split(':')[0]})", COPY)
    yield from _node_meta(ctx, cache)


def _raipack_layout(ctx) -> bool:
    """A package raipack built (its manifest says so) or checked as a reference profile: not AMD's layout."""
    from raipack.npu.profile import built_by_raipack

    return ctx.profile.target is Target.REFERENCE or built_by_raipack(ctx.pkg) is not None


def _node_meta(ctx, cache: str):
    if ctx.profile.metastate.tiered or not ctx.profile.metastate.required:
        return  # raipack's tiered plans name their cache files themselves (RP904, RP905)
    nodes: dict[str, dict[str, str]] = {}
    for stem in metastate_sets(ctx.pkg):
        folder, _, name = stem.rpartition("/")
        for phase in ("Prefill", "Token"):
            if name.startswith(f"{PREFIX}Llm_{phase}_"):
                nodes.setdefault(name[len(f"{PREFIX}Llm_{phase}_"):], {})[phase] = stem
    phases = {p for sets in nodes.values() for p in sets}
    for node, sets in sorted(nodes.items()):
        stem = next(iter(sets.values()))
        rel = f"{cache}/{node}_meta.json"
        if rel not in ctx.pkg.files:
            yield ctx.finding(rel, f"is missing: the metastate set {stem} runs node {node}, whose tensor map the runtime reads from {rel}", COPY)
        for phase in sorted(phases - set(sets)):
            other = stem.replace(f"Llm_{next(iter(sets))}_", f"Llm_{phase}_")
            yield ctx.finding(f"{other}.state", f"is missing: node {node} has no {phase.lower()} metastate set while other nodes have one; "
                              "the runtime compiles a missing state at its first load, slowly (AMD package facts §6)", COPY, severity="warning")
