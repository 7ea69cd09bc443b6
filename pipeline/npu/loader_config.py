"""Read genai_config.json as one onnxruntime-genai version's loader reads it.

The grammar of each version (pipeline/data/oga/config-<version>.json) is generated from that version's
src/config.cpp by raipack.npu.loader_grammar_gen; this module walks a config through it with the same
callbacks the C++ parser makes (an object's key asks its element for a child, an array's items reach
the child with an empty name, a scalar's key asks for a value of one JSON type) and reports what the
loader would refuse, in the loader's own words ("search: Unknown value \"tpo_p\""). Where raipack is
stricter than a loader (docs/validating.md lists each kind) it says so in the refusal.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from raipack.data import load_data

INT32 = (-(2**31), 2**31 - 1)
UNICODE_ESCAPE = re.compile(rb'(?<!\\)(?:\\\\)*\\u')


@dataclass(frozen=True)
class Refusal:
    pointer: str  # JSON pointer of the value the loader stops at ("" for the document)
    message: str  # the loader's words
    hint: str = ""
    stricter: bool = False  # True where the loader accepts this and raipack does not


@lru_cache(maxsize=None)
def versions() -> tuple[str, ...]:
    """The onnxruntime-genai versions whose grammar is generated, oldest first."""
    names = [p.name for p in resources.files("raipack.data").joinpath("oga").iterdir() if p.name.startswith("config-")]
    return tuple(sorted((n[len("config-"):-len(".json")] for n in names), key=version_key))


def version_key(version: str) -> tuple:
    parts = re.findall(r"\d+|[a-z]+", version)
    return tuple(int(p) if p.isdigit() else -1 for p in parts)  # 0.16.0-dev sorts before 0.16.0


def grammar(version: str) -> dict:
    return load_data(f"oga/config-{version}.json")


def grammar_for(version: str | None) -> tuple[str, str]:
    """The generated version to judge with, and how it was chosen."""
    known = versions()
    if version in known:
        return version, "exact"
    if not version:
        return known[-1], "newest"
    older = [v for v in known if version_key(v) <= version_key(version)]
    return (older[-1], "nearest-older") if older else (known[0], "oldest")


def judge(raw: bytes, version: str, amd: bool = False) -> list[Refusal]:
    """What onnxruntime-genai `version` (AMD's build of it when `amd`) refuses in the bytes of a
    genai_config.json; empty when it loads."""
    g = amd_grammar(version) if amd else grammar(version)
    lexical = _lexical(raw)
    if lexical:
        return [lexical]
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_Pairs, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        return [Refusal("", f"not JSON as the loader reads it: {exc}", "write plain UTF-8 JSON (json.dump with ensure_ascii=False)")]
    walker = _Walker(g)
    walker.value(g["root"], "", doc, [])
    if walker.refusals:
        return walker.refusals[:1] + [r for r in walker.refusals[1:] if r.stricter]
    return _after_parse(g, doc)


def _lexical(raw: bytes) -> Refusal | None:
    if raw.startswith(b"\xef\xbb\xbf"):
        return Refusal("", 'Unknown value "" (the file starts with a UTF-8 byte order mark)', "save genai_config.json as UTF-8 without a BOM")
    if not raw.strip():
        return Refusal("", "Unexpected end of JSON data", "genai_config.json is empty: copy it again from the package's source")
    escape = UNICODE_ESCAPE.search(raw)
    if escape is not None:
        line = raw.count(b"\n", 0, escape.start()) + 1
        return Refusal("", f"Unsupported uXXXX code used (line {line})",
                       "the loader refuses every \\uXXXX escape: write the characters themselves (json.dump(..., ensure_ascii=False))")
    return None


class _Pairs(list):
    """A JSON object as its key/value pairs in file order (the loader sees duplicates one after another)."""

    def __init__(self, pairs):
        super().__init__(pairs)


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _kind(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if value is None:
        return "null"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) and not isinstance(value, _Pairs) else "object"


class _Walker:
    def __init__(self, g: dict):
        self.g = g
        self.elements = g["elements"]
        self.refusals: list[Refusal] = []

    def value(self, parent: str, seg, value, path: list) -> None:
        """The callback `parent` gets for `seg` (a key, or an array's index: the loader's empty name)
        holding `value`, then the walk below it."""
        if self.refusals and not self.refusals[-1].stricter:
            return  # the loader stops at its first refusal
        spec = self.elements.get(parent, {})
        name = seg if isinstance(seg, str) else ""
        here = path + [seg] if path or seg != "" else path
        kind = _kind(value)
        if kind in ("object", "array"):
            slot = "objects" if kind == "object" else "arrays"
            child = spec.get(slot, {}).get(name) or spec.get("any_" + slot[:-1])
            if child is None:
                return self.unknown(spec, name, here)
            for key, item in (value if kind == "object" else enumerate(value)):
                self.value(child, key, item, here)
            return
        rule = spec.get("values", {}).get(name) or spec.get("any_value")
        if rule is None:
            return self.unknown(spec, name, here)
        self.scalar(rule, name, value, kind, here)

    def scalar(self, rule: dict, name: str, value, kind: str, path: list) -> None:
        types = rule["types"]
        if "any" not in types and kind not in types:
            return self.refuse(path, f"{name} - Expected a {' or '.join(types)} but saw a {kind}", f"make {_pointer(path)} a JSON {types[0]}")
        if kind == "number":
            self.number(rule, name, value, path)
        parser = rule.get("parser")
        if kind == "string" and parser in self.g.get("enums", {}) and value not in self.g["enums"][parser]:
            allowed = ", ".join(self.g["enums"][parser])
            self.refuse(path, f"Unrecognized value:{value}", f"{_pointer(path)} must be one of {allowed}")

    def number(self, rule: dict, name: str, value, path: list) -> None:
        how = rule.get("number")
        if how in ("int32-checked", "int-cast") and (not math.isfinite(value) or not INT32[0] <= value <= INT32[1]):
            stricter = how == "int-cast"  # C++ casts it without a check: undefined, so refused here too
            why = " (this loader casts it without a check: the value it gets is undefined)" if stricter else ""
            self.refuse(path, f"Field '{name}' value {value} is out of int32 range{why}", f"{_pointer(path)} must fit a signed 32-bit integer", stricter)
            return
        if how == "int32-checked" and self.g["json"].get("int_fraction_refused") and value != int(value):
            self.refuse(path, f"Field '{name}' value {value} is not an integer", f"{_pointer(path)} must be a whole number")
        if "minimum" in rule and value < rule["minimum"]:
            self.refuse(path, f"{name} must be >= {rule['minimum']}", f"set {_pointer(path)} to at least {rule['minimum']}")

    def unknown(self, spec: dict, name: str, path: list) -> None:
        known = sorted({*spec.get("values", {}), *spec.get("objects", {}), *spec.get("arrays", {})})
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        if not path:
            hint = "genai_config.json must be one JSON object ({\"model\": ..., \"search\": ...})"
        elif close and close[0] != name:
            hint = f"did you mean {close[0]}?"
        elif name in known:
            hint = f"{_pointer(path)} has the wrong kind of value for this loader (an object, an array or a value: see its other packages)"
        else:
            hint = "remove the key, or build the package for the onnxruntime-genai version that knows it"
        self.refuse(path, f'Unknown value "{name}"', hint)

    def refuse(self, path: list, words: str, hint: str, stricter: bool = False) -> None:
        prefix = ":".join(p for p in path[:-1] if isinstance(p, str) and p)
        message = f"{prefix}: {words}" if prefix else words
        self.refusals.append(Refusal(_pointer(path), message, hint, stricter))


def _pointer(path: list) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _after_parse(g: dict, doc) -> list[Refusal]:
    out = []
    for rule in g.get("after_parse", []):
        node = _last(doc, rule["pointer"])
        if isinstance(node, bool) or not isinstance(node, (int, float)):
            node = 0
        if rule["refuse_unless"] == "> 0" and int(node) == 0:
            out.append(Refusal(rule["pointer"], rule["message"], f"set {rule['pointer']} to the model's context length"))
    return out


def _last(doc, pointer: str):
    """The value the loader keeps at `pointer`: the last one written there (duplicates overwrite)."""
    node = doc
    for part in pointer.strip("/").split("/"):
        if not isinstance(node, _Pairs):
            return None
        found = [v for k, v in node if k == part]
        if not found:
            return None
        node = found[-1] if not isinstance(found[-1], _Pairs) else _Pairs([p for f in found if isinstance(f, _Pairs) for p in f])
    return node


@lru_cache(maxsize=None)
def amd_grammar(version: str) -> dict:
    """`version`'s grammar with what AMD's runtime build accepts beyond it (pipeline/data/oga/amd_runtime.json)."""
    base = json.loads(json.dumps(grammar(version)))
    amd = load_data("oga/amd_runtime.json")
    base["elements"].update(amd["elements"])
    for add in amd["additions"]:
        element = base["elements"].setdefault(add["element"], {})
        for slot in ("values", "objects", "arrays"):
            element.setdefault(slot, {}).update(add.get(slot, {}))
    base["onnxruntime_genai"] = f"{version} as built by AMD for Ryzen AI"
    return base
