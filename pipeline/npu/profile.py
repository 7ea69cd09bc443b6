"""Load profiles and detect which one a package follows."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from raipack.core.errors import UsageError
from raipack.npu import catalog
from raipack.npu.spec import Profile, build
from raipack.npu.target import Target

PROFILE_PACKAGE = "raipack.profiles"


def merge(base: dict, over: dict) -> dict:
    """`over` merged into a copy of `base`: objects key by key, anything else replaced."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def file_profiles() -> dict[str, dict]:
    """The profile files as written: raipack's intermediate and package-kind profiles."""
    return {pid: doc for pid, (doc, _) in _files().items()}


def _files() -> dict[str, tuple[dict, str]]:
    out = {}
    for entry in sorted(resources.files(PROFILE_PACKAGE).iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            data = json.loads(entry.read_text("utf-8"))
            out[data["id"]] = (data, f"raipack/profiles/{entry.name}")
    return out


def _source(pid: str, files: dict) -> str:
    if pid in files:
        return files[pid][1]
    return f"built by the release catalog {catalog.source()} from a template of raipack/profiles/variants/"


def raw_profiles() -> dict[str, dict]:
    """Every profile before `extends` is resolved: the files, and the release profiles the
    release catalog builds from its variant templates (raipack.npu.catalog)."""
    out = file_profiles()
    for pid, doc in catalog.release_profiles().items():
        if pid in out:
            raise RuntimeError(f"profile {pid} is both a file of raipack/profiles and a release of the catalog")
        out[pid] = doc
    return dict(sorted(out.items()))


def reload() -> None:
    """Forget the loaded release catalog and every profile built from it (after `RAIPACK_RELEASES` changed)."""
    catalog.load.cache_clear()
    catalog.templates.cache_clear()
    all_profiles.cache_clear()


@lru_cache(maxsize=None)
def all_profiles() -> dict[str, Profile]:
    """Every profile with `extends` resolved, as its typed view (checked against the profile schema)."""
    raw, files = raw_profiles(), _files()

    def resolve(pid: str, seen: tuple = ()) -> dict:
        if pid in seen:
            raise RuntimeError(f"profile {pid} extends itself through {' → '.join(seen)}")
        doc = raw[pid]
        if "extends" not in doc:
            return doc
        return merge(resolve(doc["extends"], seen + (pid,)), doc)

    return {pid: build(resolve(pid), _source(pid, files)) for pid in raw}


@lru_cache(maxsize=64)
def for_model(profile: Profile, model_type: str | None) -> Profile:
    """The profile as it applies to one model family (its `model_overrides` entry merged in)."""
    if not model_type or model_type not in profile.model_overrides:
        return profile
    doc = profile.document()
    return build(merge(doc, doc["model_overrides"][model_type]), f"{profile.source}, model_overrides {model_type}")


def changed(profile: Profile, over: dict) -> Profile:
    """A copy of `profile` with `over` merged into its document (a test's or a user's variation), checked again."""
    return build(merge(profile.document(), over), f"{profile.source}, changed")


def reference_for(target: Profile) -> Profile:
    """raipack's reference profile for an AMD release profile (the one that extends it)."""
    if target.target is Target.REFERENCE:
        return target
    for prof in all_profiles().values():
        if prof.target is Target.REFERENCE and prof.extends == target.id:
            return prof
    raise UsageError(f"profile {target.id} has no reference profile, so raipack cannot build it",
                     "build one of: " + ", ".join(p.extends for p in all_profiles().values() if p.target is Target.REFERENCE and p.extends))


def get(profile_id: str) -> Profile:
    profiles = all_profiles()
    if profile_id not in profiles:
        raise UsageError(
            f"--profile {profile_id!r} is not a known profile",
            f"choose one of: auto, {', '.join(profiles)}",
        )
    return profiles[profile_id]
