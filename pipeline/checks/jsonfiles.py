"""Every JSON file parses, and every known kind matches its schema."""

from __future__ import annotations

import json

from raipack.checks.base import check
from raipack.core import schemas
from raipack.core.package import JsonError

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
    """Every `*.json` file of the package is a regular file inside the package,
    UTF-8, valid JSON (not truncated; no NaN, Infinity or number a double
    cannot hold, such as 1e999, reported with its JSON pointer) and no larger
    than 64 MiB. Files that fail are skipped by the checks that need their
    content. A file a loader reads is the JSON object it expects: genai_config,
    config, rai_config, generation_config and tokenizer_config are not null, an
    array or a scalar, and tokenizer.json holds the `model` object the tokenizers
    library needs."""
    for fe in json_files(ctx):
        try:
            ctx.pkg.json(fe.rel)
        except JsonError as exc:
            yield ctx.finding(fe.rel, str(exc), exc.hint, exc.pointer)
    for name in ("genai_config.json", "config.json", "rai_config.json"):
        if name in ctx.pkg.dirs:
            yield ctx.finding(name, "is a folder where a JSON file belongs", "replace the folder with the file")
    yield from _shapes(ctx)


# What each loader needs at the top of the files it reads: transformers' config and tokenizer_config
# readers, onnxruntime-genai's genai_config parser (RP204 says more) and the tokenizers library, whose
# Tokenizer.from_str refuses {}, [] and null ("Model missing", "invalid type"; tests/test_pipeline/
# test_loader_config.py holds this against it).
LOADER_SHAPES = {
    "genai_config.json": "onnxruntime-genai",
    "config.json": "transformers' AutoConfig",
    "rai_config.json": "the Ryzen AI runtime",
    "generation_config.json": "transformers' GenerationConfig",
    "tokenizer_config.json": "transformers' AutoTokenizer",
    "tokenizer.json": "the tokenizers library",
}


def _shapes(ctx):
    for fe in json_files(ctx):
        reader = LOADER_SHAPES.get(fe.rel.rsplit("/", 1)[-1])
        doc = ctx.pkg.try_json(fe.rel) if reader else None
        if reader is None or (doc is None and not _is_null(ctx, fe.rel)):
            continue
        if not isinstance(doc, dict):
            yield ctx.finding(fe.rel, f"is {_kind(doc)}, not the JSON object {reader} reads", "copy the file again from the package's source")
        elif reader == "the tokenizers library" and not (isinstance(doc.get("model"), dict) and "vocab" in doc["model"]):
            yield ctx.finding(fe.rel, "has no tokenizer model (a `model` object with its `vocab`): the tokenizers library refuses it (\"Model missing\")",
                              "copy tokenizer.json again from the model's source", "/model")


def _kind(doc) -> str:
    if doc is None:
        return "JSON null"
    if isinstance(doc, bool):
        return "a JSON boolean"
    return {list: "a JSON array", str: "a JSON string"}.get(type(doc), "a JSON number")


def _is_null(ctx, rel: str) -> bool:
    try:
        return ctx.pkg.json(rel) is None
    except JsonError:
        return False


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


@check("RP203", "json-duplicate-keys")
def json_duplicate_keys(ctx):
    """No object of a `*.json` file gives the same key twice (such as
    `"hybrid_opt_token_backend": "cpu", "hybrid_opt_token_backend": "npu"`):
    JSON leaves it to each reader which value wins, so the runtime may use
    another one than raipack's checks saw (raipack checks the last)."""
    for fe in json_files(ctx):
        if ctx.pkg.try_json(fe.rel) is None:
            continue
        for dup in ctx.pkg.duplicate_keys(fe.rel):
            where = f"the object at {dup.pointer}" if dup.pointer else "the top-level object"
            values = ", then ".join(_short(v) for v in dup.values[:3]) + (", …" if len(dup.values) > 3 else "")
            yield ctx.finding(fe.rel, f"gives key {_short(dup.key)} {len(dup.values)} times in {where} ({values}); which one a reader uses is undefined",
                              "keep one of them", dup.pointer + schemas.pointer_of([dup.key]))


def _short(value, limit: int = 40) -> str:
    if isinstance(value, (dict, list)) and value:
        return "{…}" if isinstance(value, dict) else "[…]"
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"
