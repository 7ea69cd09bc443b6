"""Reading JSON strictly: `parse_json` (json.loads refusing non-finite numbers, with every key given
twice in one object and the JSON pointer of its object), `loads_strict` (the same, refusing a key
given twice) and the errors a read raises: `ReadError` (a file that cannot be read safely) and
its JSON kind `JsonError`. core/package.py reads a package's files through them."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass


class ReadError(Exception):
    """A package file that cannot be read safely; str() is the user-facing sentence."""

    def __init__(self, message: str, hint: str = "", pointer: str = ""):
        super().__init__(message)
        self.hint = hint
        self.pointer = pointer


class JsonError(ReadError, ValueError):
    """A JSON file that cannot be used (a ValueError too, as json.loads' own errors are)."""


@dataclass(frozen=True)
class DuplicateKey:
    pointer: str  # JSON pointer of the object holding the key twice
    key: str
    values: tuple  # every value the key was given, in file order


class _NonFinite(str):
    """Stands in for a number JSON can write but a double cannot hold (1e999, NaN)."""


def parse_json(text: str) -> tuple[object, list[DuplicateKey]]:
    """json.loads, refusing non-finite numbers (JsonError naming the JSON pointer)
    and returning every duplicated key with the pointer of its object."""
    doubled: list[tuple[dict, list]] = []
    non_finite: list[_NonFinite] = []

    def pairs(items):
        obj = dict(items)
        if len(obj) != len(items):
            seen: dict = {}
            for key, value in items:
                seen.setdefault(key, []).append(value)
            doubled.append((obj, [(k, tuple(v)) for k, v in seen.items() if len(v) > 1]))
        return obj

    def number(text: str):
        value = float(text)
        return value if math.isfinite(value) else _mark(text)

    def _mark(text: str):
        non_finite.append(_NonFinite(text))
        return non_finite[-1]

    try:
        doc = json.loads(text, object_pairs_hook=pairs, parse_float=number, parse_constant=_mark)
    except json.JSONDecodeError as exc:
        raise JsonError(f"is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", "fix the syntax (a truncated download is a common cause)") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise JsonError(f"is not valid JSON: {exc}", "check that the right file was placed here") from None
    except RecursionError:
        raise JsonError("is not usable JSON: nested too deeply", "check that the right file was placed here") from None
    if not non_finite and not doubled:
        return doc, []
    where = json_pointers(doc, {id(x) for x in non_finite} | {id(obj) for obj, _ in doubled})
    if non_finite:
        first = non_finite[0]
        pointer = where.get(id(first), "")
        raise JsonError(f"holds {first} at {pointer or 'the top level'}, which is not a finite number (a double overflows to infinity above about 1.8e308)",
                        "write a finite number or null; JSON has no NaN or Infinity", pointer)
    return doc, [DuplicateKey(where.get(id(obj), ""), key, values) for obj, keys in doubled for key, values in keys]


def loads_strict(text: str):
    """The one JSON reader for the files raipack reads that are not a package's (manifests, hand-overs, report
    inputs, model-package manifests): parse_json's rules, and a key given twice in one object is refused
    (JsonError, a ValueError for callers that catch those): which value a reader takes is not defined."""
    doc, duplicates = parse_json(text)
    if duplicates:
        d = duplicates[0]
        raise JsonError(f"gives the key {d.key!r} {len(d.values)} times in {d.pointer or 'the top-level object'}", "keep one of them", d.pointer)
    return doc


def json_pointers(doc, targets: set[int]) -> dict[int, str]:
    """id() of each target object inside `doc` → its JSON pointer (RFC 6901)."""
    # late: start-up time, schemas loads jsonschema-rs (~60 ms), needed only for a repeated key or a non-finite number
    from raipack.core.schemas import pointer_of

    found: dict[int, str] = {}
    stack = [(doc, "")]
    while stack and len(found) < len(targets):
        node, pointer = stack.pop()
        if id(node) in targets:
            found.setdefault(id(node), pointer)
        if isinstance(node, dict):
            stack.extend((v, pointer + pointer_of([k])) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, f"{pointer}/{i}") for i, v in enumerate(node))
    return found
