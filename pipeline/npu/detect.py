"""Which profile a package follows, and why: the one entry point is `detect(pkg)`.

A raipack manifest (or raipack's own NPU header) first, then a release the folder or repository
name states, then the content markers of each profile (schemas/profile.schema.json); the release
catalog (npu/catalog.py) says which releases and variants exist, npu/profile.py loads the profiles."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from raipack.core.package import Package
from raipack.npu import catalog, formats
from raipack.npu.genai import ryzenai_options
from raipack.npu.layout import package_files
from raipack.npu.profile import all_profiles
from raipack.npu.spec import MISSING, Condition, Profile
from raipack.npu.target import Target


@dataclass
class Detection:
    profile: Profile
    reason: str
    candidates: tuple[str, ...] = ()  # every profile the content fits, where it fits several
    unknown_release: str | None = None  # a release the folder names that the catalog does not hold


def _pointer_get(doc, pointer: str):
    node = doc
    for part in pointer.lstrip("/").split("/") if pointer not in ("", "/") else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return MISSING
    return node


def condition_holds(pkg: Package, cond: Condition) -> bool:
    """Evaluate one detection condition (shape in schemas/profile.schema.json)."""
    if cond.file is None and isinstance(cond.exists, str):
        return any(fnmatch.fnmatchcase(rel, cond.exists) for rel in pkg.files) or cond.exists in pkg.dirs
    if cond.absent is not None:
        return not any(fnmatch.fnmatchcase(rel, cond.absent) for rel in pkg.files)
    if cond.ryzenai is not None:
        opts, _ = ryzenai_options(pkg.try_json("genai_config.json"))
        return opts.get(cond.ryzenai, MISSING) == cond.equals
    value = _pointer_get(pkg.try_json(cond.file or ""), cond.pointer or "")
    if isinstance(cond.exists, bool):
        return (value is not MISSING) == cond.exists
    if value is MISSING:
        return False
    if cond.equals is not MISSING:
        return value == cond.equals
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    if cond.gt is not None:
        return value > cond.gt
    return cond.le is not None and value <= cond.le


def built_by_raipack(pkg: Package) -> Detection | None:
    """The reference profile whose markers hold: manifest.json says raipack built this package, and
    for which target. Such a package must carry raipack's own NPU formats (RP901 holds it to that)."""
    best: Profile | None = None
    best_conds: tuple[Condition, ...] = ()
    for prof in all_profiles().values():
        conds = prof.detect.content
        if prof.target is Target.REFERENCE and len(conds) > len(best_conds) and all(condition_holds(pkg, c) for c in conds):
            best, best_conds = prof, conds
    if best:
        return Detection(best, "; ".join(c.why for c in best_conds))
    return _by_reference_header(pkg)


def _by_reference_header(pkg: Package) -> Detection | None:
    """Without raipack's manifest (a copy that lost it), raipack's own model.pb.bin still says which
    reference profile it was fused for; RP901 then reports the missing manifest under that profile."""
    headers = sorted({package_files(p)["header"] for p in all_profiles().values() if p.target is Target.REFERENCE})
    name = next((h for h in headers if h in pkg.files and formats.is_reference_header(pkg.root / h)), None)
    if name is None:
        return None
    try:
        profile_id = formats.read_header(pkg.root / name).get("profile")
    except (formats.FormatError, OSError):
        return None
    prof = all_profiles().get(profile_id) if isinstance(profile_id, str) else None
    if prof is None or prof.target is not Target.REFERENCE:
        return None
    return Detection(prof, f"{name} is raipack's reference header, fused for profile {profile_id} (there is no raipack manifest)")


def detect(pkg: Package) -> Detection | None:
    """The profile a package follows, and why.

    A raipack manifest wins (raipack names its packages like AMD's). Then a folder name that
    states a release (`_rai_1.8.0_npu_16K`): a catalogued release is that release's profile; a
    release newer than the catalog is checked against the newest catalogued release of the same
    variant, said so. Then the content markers: where they fit several releases, the newest is
    taken and all are named. A name that states no release (`*-onnx-ryzenai-npu`, kept by AMD
    across releases) decides only where the content does not.
    """
    raipack = built_by_raipack(pkg)
    if raipack is not None:
        return raipack
    fits = content_fits(pkg)
    named = catalog.release_in_name(pkg.name)
    if named is not None:
        found = _by_named_release(pkg.name, named, fits)
        if found is not None:
            return found
    series = catalog.release_series_in_name(pkg.name) if named is None else None
    if series is not None:
        found = _by_series(pkg.name, series, fits)
        if found is not None:
            return found
    by_pattern = next(((prof, pattern) for prof in all_profiles().values() for pattern in prof.detect.name_patterns
                       if fnmatch.fnmatchcase(pkg.name, pattern)), None)
    if by_pattern is not None and (not fits or by_pattern[0] in fits):
        prof, pattern = by_pattern
        return Detection(prof, f"{_called(pkg.name)} {pkg.name!r} matches {pattern!r}")
    if not fits:
        return None
    found = _newest_of(fits)
    if named is not None and found.profile.release != named[0]:
        found.reason = f"{_called(pkg.name)} {pkg.name!r} names Ryzen AI {named[0]}, but the content fits none of its profiles: {found.reason}"
    if by_pattern is not None:
        found.reason = (f"{_called(pkg.name)} {pkg.name!r} fits {by_pattern[0].id} ({by_pattern[1]!r}), a name AMD keeps across "
                        f"releases, but the content does not: {found.reason}")
    return found


def _called(name: str) -> str:
    """What a package's name is: a Hugging Face repository's org/name (pipeline/places/), else its folder's."""
    return "the repository name" if "/" in name else "the folder name"


def content_fits(pkg: Package) -> list[Profile]:
    """The AMD release profiles whose content markers all hold, with the most markers."""
    fits: list[Profile] = []
    best = 0
    for prof in all_profiles().values():
        conds = prof.detect.content
        if prof.target is Target.REFERENCE or not conds or len(conds) < best or not all(condition_holds(pkg, c) for c in conds):
            continue
        fits, best = (fits if len(conds) == best else []) + [prof], len(conds)
    return fits


def _why(prof: Profile) -> str:
    return prof.detect.why()


def _newest_of(fits: list[Profile], said: str = "") -> Detection:
    fits = sorted(fits, key=lambda p: catalog.version_key(p.release))
    best = fits[-1]
    if len(fits) == 1:
        return Detection(best, said + _why(best), (best.id,))
    ids = ", ".join(p.id for p in fits)
    return Detection(best, f"{said}{_why(best)}: the content fits {ids}; checked against the newest, {best.id} "
                           f"(--profile chooses another)", tuple(p.id for p in fits))


def _by_series(name: str, series: tuple[str, str | None], fits: list[Profile]) -> Detection | None:
    """A name that states a release series (`-onnx-ryzenai-1.7-hybrid`): that series' profiles of the
    variant, the ones the content fits first; None where the content fits profiles of none of them."""
    release, variant = series
    mine = [p for p in all_profiles().values() if p.target.is_amd and p.release.startswith(release + ".")
            and (variant is None or catalog.variant_of(p) == variant)]
    said = f"{_called(name)} {name!r} names Ryzen AI {release}" + (f", variant {variant}" if variant else "") + ": "
    if fits:
        mine = [p for p in mine if p in fits]
    return _newest_of(mine, said) if mine else None


def _by_named_release(name: str, named: tuple[str, str | None], fits: list[Profile]) -> Detection | None:
    release, variant = named
    entry = catalog.entry(release)
    profiles = all_profiles()
    if entry is not None:
        ids = [catalog.profile_id(entry, v) for v in (entry.get("variants") or {})]
        if variant is not None and catalog.profile_id(entry, variant) in profiles:
            return Detection(profiles[catalog.profile_id(entry, variant)], f"{_called(name)} {name!r} names Ryzen AI {release}, variant {variant}")
        mine = [p for p in fits if p.id in ids]
        if mine:
            return _newest_of(mine, f"{_called(name)} {name!r} names Ryzen AI {release} and the content decides the variant: ")
        return None
    newest = catalog.newest()
    if catalog.version_key(release) <= catalog.version_key(newest):
        return None  # an older release raipack has no entry for: the content decides, RP108 names the release
    same = [p for p in profiles.values() if p.target.is_amd and catalog.variant_of(p) == variant] if variant else fits
    if not same:
        return None
    newest_same = max(catalog.version_key(p.release) for p in same)
    same = [p for p in same if catalog.version_key(p.release) == newest_same]
    known = f"{_called(name)} {name!r} names Ryzen AI {release}, newer than raipack's release catalog (newest {newest}): checked against "
    if len(same) == 1:
        return Detection(same[0], f"{known}{same[0].id}, the newest known release of variant {catalog.variant_of(same[0])}", (same[0].id,), release)
    found = _newest_of([p for p in same if p in fits] or same, known)
    found.unknown_release = release
    return found
