"""The JSON Schemas of raipack's artefacts, and their errors as sentences.

The schemas live in the repo's top-level `schemas/` folder, shipped as the
data package `raipack.schemas`; core/schema_files.py finds and loads them. `errors(name, doc)` turns jsonschema's errors
into (JSON pointer, one sentence) pairs such as
`/search/max_length is "4096" (a string); expected an integer of at least 1`.
A schema may give a keyword's expectation in plain words with `x-expected`.

Two validators read the same schema files. The compiled one (jsonschema-rs,
each schema compiled once per process, on first use) gives every verdict;
jsonschema runs only when it rejects a document, to word the errors, and has
the last word: where the compiled validator is stricter (Python's `$` also
matches before a final newline; it refuses an int or str subclass) the
verdict stays jsonschema's. Documents are JSON as json and tomllib read them
(jsonschema-rs would take a tuple as an array; no reader makes one). Without
jsonschema-rs (a platform it has no wheel for) jsonschema does both, slower.
Neither ever fetches a schema: a `$ref` may only name one of raipack's own
schemas, and `format` is an annotation on both, never an assertion.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import TYPE_CHECKING

from raipack.core.errors import RaipackError
from raipack.core.schema_files import REPO_DIR as REPO_DIR  # re-exported, with load: callers know schemas.load
from raipack.core.schema_files import _base_of, _documents, _registry, _text, names
from raipack.core.schema_files import load as load

try:
    import jsonschema_rs
except ImportError:  # no wheel for this platform: jsonschema alone gives the verdicts
    jsonschema_rs = None  # type: ignore[assignment]  # the module or None: every use checks which

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

MAX_SHOWN = 60


@lru_cache(maxsize=None)
def validator(name: str) -> Draft202012Validator:
    """A cached draft 2020-12 validator whose $refs resolve offline among our schemas."""
    from jsonschema import Draft202012Validator

    if name not in names():
        _text(name)  # raises the UsageError
    return Draft202012Validator(_documents()[name], registry=_registry())


# ---------------------------------------------------------------- the compiled path


@lru_cache(maxsize=None)
def fast_validator(name: str):
    """The compiled (jsonschema-rs) validator of schema `name`, once per process; None without jsonschema-rs."""
    if name not in names():
        _text(name)  # raises the UsageError
    return None if jsonschema_rs is None else compile_schema(_documents()[name])


def compile_schema(schema: dict):
    """A jsonschema-rs draft 2020-12 validator of `schema` that treats `format` as an annotation (as
    jsonschema does without a format checker) and resolves a `$ref` only to raipack's own schemas."""
    refused: list[str] = []

    def retrieve(uri: str):
        doc = _by_id().get(uri)
        if doc is None:
            refused.append(uri)
            raise LookupError(f"{uri} is not one of raipack's schemas")
        return doc

    try:
        return jsonschema_rs.Draft202012Validator(schema, validate_formats=False, retriever=retrieve)
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError) as exc:
        if not refused:
            raise
        where = schema.get("$id", "a schema") if isinstance(schema, dict) else "a schema"
        raise RaipackError(
            f"{where} refers to {refused[0]}, which is not one of raipack's schemas; raipack never fetches a schema",
            "a $ref may only name a schema of raipack's schemas/ folder, such as https://raipack.dev/schemas/genai_config.schema.json",
        ) from exc


@lru_cache(maxsize=None)
def _by_id() -> dict[str, dict]:
    return {doc["$id"]: doc for doc in _documents().values()}


def _fast_says_valid(name: str, instance) -> bool:
    """The compiled validator accepts `instance` (False without it, or for a value it cannot take)."""
    fast = fast_validator(name)
    try:
        return fast is not None and fast.is_valid(instance)
    except ValueError:  # a Python value it does not convert (an int subclass, a set): jsonschema decides
        return False


def is_valid(name: str, instance) -> bool:
    """Whether `instance` follows schema `name`. The compiled validator accepts; jsonschema has the last
    word on what it rejects (it also takes dict and int subclasses, which jsonschema-rs refuses)."""
    return _fast_says_valid(name, instance) or validator(name).is_valid(instance)


# ---------------------------------------------------------------- messages


def pointer_of(parts) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _label(pointer: str) -> str:
    return pointer or "the document"


def _shown(value) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "an empty string" if value == "" else "a string"
    if isinstance(value, list):
        return "an empty array" if not value else "an array"
    if isinstance(value, dict):
        return "an empty object" if not value else "an object"
    return type(value).__name__


_TYPE = {
    "integer": ("an integer", "integers"),
    "number": ("a number", "numbers"),
    "string": ("a string", "strings"),
    "boolean": ("a boolean (true or false)", "booleans"),
    "object": ("an object", "objects"),
    "array": ("an array", "arrays"),
    "null": ("null", "nulls"),
}


def _or(items: list[str]) -> str:
    items = list(dict.fromkeys(items))
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def _resolve(schema):
    """Follow $ref (local or by $id) to the schema it names."""
    seen = 0
    while isinstance(schema, dict) and "$ref" in schema and seen < 10:
        base = _base_of().get(id(schema), "")
        try:
            schema = _registry().resolver(base_uri=base).lookup(schema["$ref"]).contents
        except Exception:  # an unresolvable ref just gives a vaguer phrase
            return {}
        seen += 1
    return schema


def _type_phrase(types, schema=None) -> str:
    types = [types] if isinstance(types, str) else list(types)
    out = []
    for t in types:
        if t == "array" and isinstance(schema, dict):
            items = _resolve(schema.get("items"))
            if isinstance(items, dict) and isinstance(items.get("type"), str):
                out.append("an array of " + _TYPE.get(items["type"], (t, t + "s"))[1])
                continue
        out.append(_TYPE.get(t, (t, t))[0])
    return _or(out)


def _phrase(schema) -> str:
    """What a schema expects, in words."""
    if schema is True or schema == {}:
        return "any value"
    if not isinstance(schema, dict):
        return "a value"
    if "x-expected" in schema:
        return schema["x-expected"]
    if "$ref" in schema:
        return _phrase(_resolve(schema))
    if "const" in schema:
        return json.dumps(schema["const"])
    if "enum" in schema:
        return _enum_phrase(schema["enum"])
    if "type" in schema:
        return _range_phrase(schema) or _type_phrase(schema["type"], schema)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return _or([_phrase(s) for s in schema[key]])
    return "a value"


def _enum_phrase(values) -> str:
    shown = [json.dumps(v) for v in values]
    return shown[0] if len(shown) == 1 else "one of " + ", ".join(shown)


def _num(n) -> str:
    return str(int(n)) if isinstance(n, float) and n.is_integer() else str(n)


def _range_phrase(schema) -> str:
    types = schema.get("type")
    if isinstance(types, list):
        numeric = [t for t in types if t in ("integer", "number")]
        if not numeric:
            return ""
        what = _TYPE[numeric[0]][0]
        rest = [_TYPE.get(t, (t,))[0] for t in types if t not in ("integer", "number")]
    else:
        if types not in ("integer", "number"):
            return ""
        what, rest = _TYPE[types][0], []
    lo, hi = schema.get("minimum"), schema.get("maximum")
    xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if lo is not None and hi is not None:
        text = f"{what} from {_num(lo)} to {_num(hi)}"
    elif lo is not None:
        text = f"{what} of at least {_num(lo)}"
    elif xlo is not None:
        text = f"{what} greater than {_num(xlo)}"
    elif hi is not None:
        text = f"{what} of at most {_num(hi)}"
    elif xhi is not None:
        text = f"{what} less than {_num(xhi)}"
    else:
        return ""
    return _or([text] + rest)


def _is_property_name_error(err) -> bool:
    return "propertyNames" in err.absolute_schema_path


def _explain(err):
    """(pointer, sentence) pairs for one jsonschema error (recursing into anyOf/oneOf)."""
    pointer = pointer_of(err.absolute_path)
    label = _label(pointer)
    kw, value, schema = err.validator, err.instance, err.schema
    expected = schema.get("x-expected") if isinstance(schema, dict) else None

    if _is_property_name_error(err):
        key_ptr = pointer + pointer_of([value])
        what = expected or _phrase(schema)
        yield key_ptr, f"{key_ptr}: the key {_shown(value)} is not allowed; expected {what}"
        return

    if kw in ("anyOf", "oneOf"):
        yield from _explain_branches(err, pointer, label)
        return

    if kw == "required":
        props = schema.get("properties", {}) if isinstance(schema, dict) else {}
        for key in err.validator_value:
            if isinstance(value, dict) and key not in value:
                yield pointer + pointer_of([key]), f"{pointer + pointer_of([key])} is missing; expected {_phrase(props.get(key))}"
        return

    if kw == "additionalProperties":
        props = schema.get("properties", {})
        patterns = schema.get("patternProperties", {})
        allowed = [k for k in props if not k.startswith("$")]
        for key in value:
            if key in props or any(re.search(p, key) for p in patterns):
                continue
            where = pointer + pointer_of([key])
            yield where, f"{where} is not a known field; {label} may only have {', '.join(allowed) or 'no fields'}"
        return

    if kw == "dependentRequired":
        for key, needed in err.validator_value.items():
            if key in value:
                for dep in needed:
                    if dep not in value:
                        where = pointer + pointer_of([dep])
                        yield where, f"{where} is missing; it is required when {key} is present"
        return

    shown = _shown(value)
    if kw == "type":
        what = expected or _type_phrase(err.validator_value, schema)
        kind = "" if value is None else f" ({_kind(value)})"
        yield pointer, f"{label} is {shown}{kind}; expected {what}"
    elif kw in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        yield pointer, f"{label} is {shown}; expected {_range_phrase(schema) or expected or err.message}"
    elif kw == "enum":
        yield pointer, f"{label} is {shown}; expected {expected or _enum_phrase(err.validator_value)}"
    elif kw == "const":
        yield pointer, f"{label} is {shown}; expected {expected or json.dumps(err.validator_value)}"
    elif kw == "pattern":
        yield pointer, f"{label} is {shown}; expected {expected or 'a string matching ' + err.validator_value}"
    elif kw == "format":
        yield pointer, f"{label} is {shown}; expected {expected or 'a ' + err.validator_value + ' string'}"
    elif kw in ("minLength", "maxLength"):
        n = err.validator_value
        if kw == "minLength":
            what = "a non-empty string" if n == 1 else f"a string of at least {n} characters"
        else:
            what = f"a string of at most {n} characters"
        yield pointer, f"{label} is {shown}; expected {what}"
    elif kw in ("minItems", "maxItems"):
        n = err.validator_value
        what = ("a non-empty array" if n == 1 else f"at least {n} items") if kw == "minItems" else f"at most {n} items"
        yield pointer, f"{label} is {shown}; expected {what}"
    elif kw in ("minProperties", "maxProperties"):
        n = err.validator_value
        if kw == "minProperties":
            what = "at least one entry" if n == 1 else f"at least {n} entries"
        else:
            what = "exactly one entry" if n == 1 else f"at most {n} entries"
        yield pointer, f"{label} is {shown}; expected {what}"
    elif kw == "uniqueItems":
        yield pointer, f"{label} is {shown}; expected no duplicate items"
    elif kw == "false":
        yield pointer, f"{label} is not allowed here"
    else:
        yield pointer, f"{label} is {shown}; {err.message}"


_ROOT_REJECTIONS = ("type", "const", "enum")


def _explain_branches(err, pointer, label):
    """anyOf/oneOf: report the branch the value was meant for, not 'valid under none'."""
    value = err.instance
    if not err.context:  # oneOf matched more than one branch
        yield pointer, f"{label} is {_shown(value)}; expected exactly one of {_phrase(err.schema)}"
        return
    branches: dict[int, list] = {}
    for sub in err.context:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    choices = err.validator_value
    candidates = {
        i: errs for i, errs in branches.items()
        if not any(not e.relative_path and e.validator in _ROOT_REJECTIONS for e in errs)
    }
    expected = err.schema.get("x-expected") if isinstance(err.schema, dict) else None
    if not candidates:  # the value's type fits no branch: one sentence listing them
        what = expected or _or([_phrase(s) for s in choices])
        kind = "" if value is None else f" ({_kind(value)})"
        yield pointer, f"{label} is {_shown(value)}{kind}; expected {what}"
        return

    def score(item):
        _, errs = item
        return (len(errs), -max(len(e.relative_path) for e in errs))

    ranked = sorted(candidates.items(), key=lambda item: (score(item), item[0]))
    if len(ranked) > 1 and score(ranked[0]) == score(ranked[1]) and expected:
        yield pointer, f"{label} is {_shown(value)}; expected {expected}"
        return
    for sub in ranked[0][1]:
        yield from _explain(sub)


def errors(name: str, instance) -> list[tuple[str, str]]:
    """(JSON pointer, sentence) for every way `instance` breaks schema `name`, sorted by pointer.

    The compiled validator decides; jsonschema words the errors of an invalid document only."""
    if _fast_says_valid(name, instance):
        return []
    found = set()
    for err in validator(name).iter_errors(instance):
        found.update(_explain(err))
    return sorted(found)
