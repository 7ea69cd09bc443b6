"""Bucket completeness: dd_metastate sets, sequence-length tiers, cache meta files."""

from __future__ import annotations

from collections import Counter

from raipack.checks.base import check
from raipack.core.members import grouped
from raipack.npu.layout import PREFIX, is_inside, metastate_sets, tiers_present
from raipack.npu.settings import expected_tiers


@check("RP601", "metastate-sets")
def metastate_complete(ctx):
    """Every dd_metastate set has its `.state` file and the siblings the
    profile requires (e.g. `.fconst`, `.super`, `.ctrlpkt` for 1.6); no
    sibling is orphaned (a `.fconst` without its `.state`); a profile that
    needs metastate finds at least one set. A set that lacks a file the
    release's layout ships together with the ones it has (`.state`, `.super`
    and `.ctrlpkt` present, `.fconst` missing: the profile's
    `metastate.ship_together`), or a file that every other set (or most sets)
    of the package has, is an incomplete copy: a warning naming the set and
    the missing file, an error where the profile requires that file. A set
    missing a member its release ships together with the others is an error:
    the runtime cannot run the node (a 1.6 package without its `.fconst`, the
    token-phase weight stream, cannot decode at all: AMD package facts §6 [V3]).
    A set whose `.state` alone is gone is a warning when the release's layout
    makes that file optional: the runtime compiles and writes a missing state
    at first load, slowly (§6 [V]). A Git LFS pointer counts as present
    (RP102 reports it)."""
    spec = ctx.profile.metastate
    sets = metastate_sets(ctx.pkg)
    if spec.required and not sets:
        yield ctx.finding(PREFIX + "*", f"no dd_metastate files: profile {ctx.profile.id} packages carry one set per NPU node", "copy all dd_metastate_* files of the package")
        return
    required = set(spec.siblings)
    known = required | set(spec.optional_siblings)
    seen = Counter(ext for exts in sets.values() for ext in exts if ext in known or not known)
    for stem, exts in sorted(sets.items()):
        if "state" not in exts and "state" in known:
            for _ext, rel in sorted(exts.items()):
                yield ctx.finding(rel, f"is orphaned: {stem}.state is missing", "copy the missing .state file, or remove the leftover")
            continue
        for ext in sorted(required - set(exts)):
            yield ctx.finding(f"{stem}.{ext}", f"is missing from the metastate set {stem} (profile {ctx.profile.id} requires .{ext})", "copy all dd_metastate_* files of the package")
        yield from _usual_siblings(ctx, stem, exts, required, seen, len(sets))
        for ext in sorted(set(exts) - known):
            if known:
                yield ctx.finding(exts[ext], f"has an extension .{ext} that profile {ctx.profile.id} does not know", "remove stray files from the package", severity="warning")


def _usual_siblings(ctx, stem: str, exts: dict, required: set, seen: Counter, total: int):
    """Warnings for the files a set lacks that its release ships with the ones it has, or that
    every other set (or most sets) of the package has; required files are RP601's errors already."""
    reported = set(required)
    for group in ctx.profile.metastate.ship_together:
        have = [e for e in group if e in exts]
        for ext in group:
            if have and ext not in exts and ext not in reported:
                reported.add(ext)
                yield ctx.finding(f"{stem}.{ext}", f"is missing from the metastate set {stem}, which has {_listed(sorted(exts))}: profile {ctx.profile.id}'s layout ships {_listed(group)} together, and the runtime cannot run the node without it", _copy_again(stem, ext))
    for ext in sorted(set(seen) - set(exts) - reported):
        if total > 1 and seen[ext] == total - 1:
            yield ctx.finding(f"{stem}.{ext}", f"is missing from the metastate set {stem} while the other {seen[ext]} sets of the package all have a .{ext} file", _copy_again(stem, ext), severity="warning")
        elif seen[ext] * 2 > total:
            yield ctx.finding(f"{stem}.{ext}", f"is missing from the metastate set {stem} while {seen[ext]} of {total} sets of the package have a .{ext} file", _copy_again(stem, ext), severity="warning")


def _copy_again(stem: str, ext: str) -> str:
    return f"the package was copied incompletely: copy {stem}.{ext} again from the original package"


def _listed(exts: list[str]) -> str:
    names = [f".{e}" for e in exts]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


@check("RP602", "bucket-tiers")
def bucket_tiers(ctx):
    """For layouts with one metastate set per sequence-length tier
    (`dd_metastate_Llm_<Prefill|Token>_<node>_<L>`): the declared tiers are
    strictly increasing; every declared tier up to `search.max_length` has its
    set for every node; the largest token tier covers `search.max_length` and
    the largest prefill tier covers the chunk size; files for undeclared tiers
    are reported as extras."""
    if not ctx.profile.metastate.tiered:
        return
    S = ctx.settings
    declared = ctx.profile.buckets
    present = tiers_present(ctx.pkg)
    phases = (("Prefill", "prefill", S.one_pass()), ("Token", "token", S.max_length))
    for phase, key, must_cover in phases:
        tiers = list(declared.of(key))
        if any(b <= a for a, b in zip(tiers, tiers[1:])):
            yield ctx.finding("", f"profile {ctx.profile.id} declares {key} tiers {tiers}, which are not strictly increasing", "fix the profile's bucket list")
        wanted = expected_tiers(tiers, key, S.max_length)
        nodes = present[phase]
        if wanted and not nodes:
            yield ctx.finding(f"dd_metastate_Llm_{phase}_*", f"no {key} tier sets found; profile {ctx.profile.id} declares tiers {wanted}", "rebuild the package with raipack build")
            continue
        for node, have in sorted(nodes.items()):
            for t in wanted:
                if t not in have:
                    yield ctx.finding(f"dd_metastate_Llm_{phase}_{node}_{t}.state", f"is missing: {key} tier {t} of node {node} has no metastate set", "rebuild the package; a tier without its plan cannot run")
            for t in sorted(have - set(wanted)):
                yield ctx.finding(f"dd_metastate_Llm_{phase}_{node}_{t}.state", f"is an extra {key} tier {t} that profile {ctx.profile.id} does not declare", "remove it or rebuild with the right profile", severity="warning")
            top = max(have)
            if must_cover and top < must_cover:
                yield ctx.finding(f"dd_metastate_Llm_{phase}_{node}_{top}.state", f"the largest {key} tier is {top}, below the {must_cover} tokens the settings allow", "add a tier that covers the length, or lower the length settings")


@check("RP603", "cache-meta")
def cache_meta(ctx):
    """Every `cache/<node>_meta.json` tensor map names files that exist with the
    recorded `file_size`: a name relative to the meta's folder (raipack's
    packages), or, as AMD's Windows-built packages write it, relative to the
    package with the cache folder first and Windows separators
    (`.cache\\MatMulNBits_2_0_0.const`; `.cache/x.const` once AMD's Linux step
    made it a slash, docs/llm_linux.rst)."""
    for fe in ctx.pkg.by_role("cache_meta"):
        meta = ctx.pkg.try_json(fe.rel)
        if not isinstance(meta, dict):
            continue
        found = list(_meta_files(ctx, fe, meta))
        missing = [f for f, name in found if name]
        yield from grouped(missing, "files its tensor map names are not in the package", [name for _, name in found if name])
        yield from (f for f, name in found if not name)


def _meta_files(ctx, fe, meta):
    """(finding, missing file name or "") for the files one meta's tensor map names."""
    folder = fe.rel.rsplit("/", 1)[0]
    tmap = meta.get("tensor_map")
    entries = tmap.items() if isinstance(tmap, dict) else enumerate(tmap) if isinstance(tmap, list) else ()
    for key, entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("file_name"), str):
            continue
        name, pointer = entry["file_name"], f"/tensor_map/{key}/file_name"
        if not is_inside(name):
            yield ctx.finding(fe.rel, f"tensor {key} names {name!r}, a path that leaves the package", "name a file in the cache folder", pointer), ""
            continue
        target = _cache_file(ctx.pkg, folder, name)
        if target is None:
            yield ctx.finding(fe.rel, f"tensor {key} names {name}, which is not in {folder}/", "copy the whole cache folder", pointer), name
        elif isinstance(entry.get("file_size"), int) and entry["file_size"] != target.size and not target.lfs:
            yield ctx.finding(target.rel, f"is {target.size} bytes but {fe.rel} records {entry['file_size']}", "copy the cache folder again", f"/tensor_map/{key}/file_size"), ""


def _cache_file(pkg, folder: str, name: str):
    """The file a tensor map entry names: inside the meta's folder, or from the package root
    when the name starts with that folder (AMD writes `.cache\\<node>_<n>.const`)."""
    norm = name.replace("\\", "/")
    found = pkg.files.get(f"{folder}/{norm}")
    if found is None and norm.startswith(folder + "/"):
        found = pkg.files.get(norm)
    return found
