"""Every JSON file parses, and every known kind matches its schema."""

from __future__ import annotations

from .. import schemas
from ..package import JsonError
from . import check

# file role → schema name (schemas/<name>.schema.json)
SCHEMA_OF_ROLE = {
    "genai_config": "genai_config",
    "rai_config": "rai_config",
    "model_config": "model_config",
    "generation_config": "generation_config",
    "cache_meta": "cache_meta",
    "manifest": "manifest",
}


def json_files(ctx):
    for fe in ctx.pkg.files.values():
        if fe.rel.endswith(".json") and not fe.lfs:
            yield fe


@check("RP201", "json-parse")
def json_parse(ctx):
    """Every `*.json` file of the package is UTF-8, valid JSON (no NaN or
    Infinity, not truncated) and no larger than 64 MiB. Files that fail are
    skipped by the checks that need their content."""
    for fe in json_files(ctx):
        try:
            ctx.pkg.json(fe.rel)
        except JsonError as exc:
            yield ctx.finding(fe.rel, str(exc), exc.hint)
    for name in ("genai_config.json", "config.json", "rai_config.json"):
        if name in ctx.pkg.dirs:
            yield ctx.finding(name, "is a folder where a JSON file belongs", "replace the folder with the file")


@check("RP202", "json-schema")
def json_schema(ctx):
    """Each known JSON file matches its JSON Schema (draft 2020-12; print one
    with `raipack schemas NAME`): genai_config, config (with Quark's
    quantization_config), rai_config, generation_config, cache/<node>_meta and
    raipack's manifest. The finding carries the JSON pointer of the field."""
    for fe in json_files(ctx):
        name = SCHEMA_OF_ROLE.get(fe.role)
        doc = ctx.pkg.try_json(fe.rel) if name else None
        if doc is None:
            continue
        for pointer, message in schemas.errors(name, doc):
            yield ctx.finding(fe.rel, message, f"see `raipack schemas {name}` for the expected shape", pointer)
