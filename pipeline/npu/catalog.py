"""The Ryzen AI release catalog (`raipack/data/ryzenai_releases.json`) and the release profiles built
from it: each release lists the variants it ships, each variant names a template of
`raipack/profiles/variants/`, and the profile `<release>-<variant>` is that template with the
release's facts filled in (and raipack's reference profile beside it where the release is a build
target). A new release is one catalog entry; `RAIPACK_RELEASES` names another catalog file (a test's
copy, or a user's catalog that knows a release raipack does not yet)."""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path

from raipack.core.errors import UsageError
from raipack.npu.target import Target, target_of

CATALOG_ENV = "RAIPACK_RELEASES"
VARIANTS_PACKAGE = "raipack.profiles"
PLACEHOLDERS = ("release", "profile", "title")


def version_key(version: str) -> tuple[int, ...]:
    """"1.8.0" → (1, 8, 0); "1.6" sorts with "1.6.0"; anything not numeric sorts first."""
    parts = []
    for part in str(version).split("."):
        if not part.isdigit():
            return ()
        parts.append(int(part))
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


@lru_cache(maxsize=None)
def load() -> dict:
    """The catalog: the shipped file, or the one `RAIPACK_RELEASES` names."""
    override = os.environ.get(CATALOG_ENV)
    if override:
        path = Path(override)
        try:
            return json.loads(path.read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"{CATALOG_ENV}={override}: the release catalog could not be read ({exc})",
                             f"point {CATALOG_ENV} at a JSON file shaped like raipack's data/ryzenai_releases.json, or unset it") from exc
    return json.loads(resources.files("raipack.data").joinpath("ryzenai_releases.json").read_text("utf-8"))


def source() -> str:
    """Where the catalog was read from, for error sentences."""
    return os.environ.get(CATALOG_ENV) or "raipack/data/ryzenai_releases.json"


def releases() -> list[dict]:
    return load()["releases"]


def entry(release: str) -> dict | None:
    """The catalog entry of `release`: exact, else the same version ("1.6" is "1.6.0")."""
    key = version_key(release)
    return next((r for r in releases() if r["release"] == release), None) or next((r for r in releases() if key and version_key(r["release"]) == key), None)


def newest() -> str:
    return max((r["release"] for r in releases()), key=version_key)


@lru_cache(maxsize=None)
def templates() -> dict[str, dict]:
    """The variant templates, their own `extends` resolved."""
    folder = resources.files(VARIANTS_PACKAGE).joinpath("variants")
    raw = {e.name[: -len(".json")]: json.loads(e.read_text("utf-8")) for e in folder.iterdir() if e.name.endswith(".json")}

    def resolve(name: str, seen: tuple = ()) -> dict:
        if name not in raw:
            raise UsageError(f"the release catalog names the variant template {name!r}, which does not exist",
                             f"use one of: {', '.join(sorted(raw))}")
        if name in seen:
            raise RuntimeError(f"variant template {name} extends itself through {' → '.join(seen)}")
        doc = dict(raw[name])
        base = doc.pop("extends", None)
        doc.pop("$comment", None)
        return apply(resolve(base, seen + (name,)), doc, keep_null=True) if base else doc

    return {name: resolve(name) for name in raw}


def apply(base: dict, over: dict, keep_null: bool = False) -> dict:
    """`over` merged into a copy of `base`, objects key by key; a null value removes the key
    (a catalog entry's `set`), or is kept as a value (`keep_null`: a template's own keys)."""
    out = dict(base)
    for key, value in over.items():
        if value is None and not keep_null:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = apply(out[key], value, keep_null)
        else:
            out[key] = value
    return out


def _fill(node, values: dict):
    if isinstance(node, dict):
        return {k: _fill(v, values) for k, v in node.items()}
    if isinstance(node, list):
        return [_fill(v, values) for v in node]
    if isinstance(node, str):
        for name in PLACEHOLDERS:
            node = node.replace("{" + name + "}", values[name])
    return node


def prompt_table(until: str | None = None) -> dict[str, int]:
    """rai_config.json's max_prompt_length table: every catalogued release's longest prompt."""
    rows = sorted((r for r in releases() if r.get("max_prompt_length")), key=lambda r: version_key(r["release"]))
    limit = version_key(until) if until else None
    return {r["release"]: r["max_prompt_length"]["value"] for r in rows if limit is None or version_key(r["release"]) <= limit}


def profile_id(rel: dict, variant: str) -> str:
    return f"{rel.get('profile_prefix', rel['release'])}-{variant}"


def release_profiles() -> dict[str, dict]:
    """The profile documents every catalogued release's variants make (reference ones with `extends`)."""
    out: dict[str, dict] = {}
    tmpl = templates()
    for rel in releases():
        for variant, spec in (rel.get("variants") or {}).items():
            pid = profile_id(rel, variant)
            body = _fill(_set(tmpl[_template_name(spec, pid)], spec), {"release": rel["release"], "profile": pid, "title": ""})
            table = prompt_table(spec.get("prompt_table_until"))
            out[pid] = {"id": pid, "title": body.pop("title"), "release": rel["release"], **body, "max_prompt_length": table}
            ref = spec.get("reference")
            if ref is not None:
                rid = ref.get("id", f"reference-{pid}")
                name = ref.get("template", "reference-hybrid" if target_of(out[pid]) is Target.HYBRID else "reference-npu")
                rbody = _fill(_set(tmpl[_template_name({"template": name}, rid)], ref), {"release": rel["release"], "profile": pid, "title": out[pid]["title"]})
                out[rid] = {"id": rid, "extends": pid, **rbody}
    return out


def _template_name(spec: dict, pid: str) -> str:
    name = spec.get("template")
    if name not in templates():
        raise UsageError(f"the release catalog's profile {pid} names the variant template {name!r}, which does not exist",
                         f"use one of: {', '.join(sorted(templates()))}")
    return name


def _set(template: dict, spec: dict) -> dict:
    over = {k: v for k, v in (spec.get("set") or {}).items() if k != "$comment"}
    return apply(template, over)


def release_in_name(name: str) -> tuple[str, str | None] | None:
    """(release, variant or None) that a folder name states, as AMD names its packages
    (`Phi-3.5-mini-instruct_rai_1.8.0_npu_16K` → ("1.8.0", "npu-16K")); None if it states none."""
    rule = load()["name_release"]
    match = re.search(rule["pattern"], name)
    if match is None:
        return None
    suffix = match["kind"] + (f"_{match['context']}" if match["context"] else "")
    return match["release"], rule["variants"].get(suffix)


def release_series_in_name(name: str) -> tuple[str, str | None] | None:
    """(release series, variant or None) a folder name states the way AMD's 1.7 hybrid collection
    names its folders (`SmolLM2-135M-Instruct-onnx-ryzenai-1.7-hybrid` → ("1.7", "hybrid")); None if none."""
    rule = load()["name_release"]
    match = re.search(rule["series_pattern"], name) if rule.get("series_pattern") else None
    if match is None:
        return None
    return match["release"], rule["variants"].get(match["kind"])


def variant_of(prof) -> str | None:
    """The catalog variant a release profile was built from (its id after the release prefix)."""
    for rel in releases():
        for variant in rel.get("variants") or {}:
            if profile_id(rel, variant) == prof.id:
                return variant
    return None
