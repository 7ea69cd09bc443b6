"""Seeded mutations of real genai_config.json files, as bytes: what a careless edit or a tool's bug
writes (a key misspelled at some depth, a value's type flipped, a key deleted or added, a number out
of range, an escape, a byte order mark, a document that is not an object). `mutations(docs, n, seed)`
gives n (name, bytes) pairs; the same seed gives the same cases."""

from __future__ import annotations

import json
import random
import string

SWAPS = ["x", 7, 1.5, True, False, None, {}, [], ["a"], {"a": "b"}, "4096", 2**31, -(2**31) - 1, 1e300, 0, -1, 0.5]
WHOLE = [b"null", b"[]", b'"x"', b"1", b"{}", b"", b"  ", b"true", b'{"model": "x"}', b'{"model": null}', b'{"search": []}']


def _paths(doc, prefix=()):
    """Every (container path, key or index) in doc."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield prefix, k
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield prefix, i
            yield from _paths(v, prefix + (i,))


def _node(doc, path):
    for p in path:
        doc = doc[p]
    return doc


def _misspell(rng: random.Random, key: str) -> str:
    if len(key) < 2:
        return key + "x"
    i = rng.randrange(len(key) - 1)
    how = rng.randrange(4)
    if how == 0:
        return key[:i] + key[i + 1] + key[i] + key[i + 2:]
    if how == 1:
        return key[:i] + key[i + 1:]
    if how == 2:
        return key[:i] + key[i] + key[i:]
    return key[:i] + rng.choice(string.ascii_lowercase) + key[i + 1:]


def _rename(doc: dict, key, new) -> dict:
    return {new if k == key else k: v for k, v in doc.items()}


def _misspelled(rng, doc, spots):
    parent_path, key = rng.choice(spots)
    parent = _node(doc, parent_path)
    if not isinstance(key, str):
        return _flipped(rng, doc, spots)
    new = _misspell(rng, key)
    if not parent_path:
        return _rename(doc, key, new)
    _node(doc, parent_path[:-1])[parent_path[-1]] = _rename(parent, key, new)
    return doc


def _flipped(rng, doc, spots):
    parent_path, key = rng.choice(spots)
    parent = _node(doc, parent_path)
    parent[key] = rng.choice([v for v in SWAPS if type(v) is not type(parent[key])])
    return doc


def _deleted(rng, doc, spots):
    parent_path, key = rng.choice(spots)
    del _node(doc, parent_path)[key]
    return doc


def _added(rng, doc, spots):
    parent_path, _key = rng.choice(spots)
    parent = _node(doc, parent_path)
    target = parent if isinstance(parent, dict) else doc
    target[rng.choice(["extra", "tpo_p", "filename", "max_length", "RyzenAI", "x" * 3])] = rng.choice(SWAPS)
    return doc


def _renumbered(rng, doc, spots):
    numbers = [(p, k) for p, k in spots if isinstance(_node(doc, p)[k], (int, float)) and not isinstance(_node(doc, p)[k], bool)]
    if numbers:
        p, k = rng.choice(numbers)
        _node(doc, p)[k] = rng.choice([2**31, 2**31 - 1, -(2**31) - 1, 1e300, 0.5, -1, 0, 3.0, 1e-300, 2**53])
    return doc


def _lexical(rng, doc, _spots) -> bytes:
    raw = json.dumps(doc, indent=2, ensure_ascii=False).encode()
    how = rng.randrange(4)
    if how == 0:
        return b"\xef\xbb\xbf" + raw
    if how == 1:
        return raw.replace(b'"', b'"\\u0041', 1)
    if how == 2:
        return json.dumps(_with_non_ascii(doc, rng), indent=2, ensure_ascii=True).encode()
    return raw[: rng.randrange(1, len(raw))]


def _whole(rng, _doc, _spots) -> bytes:
    return rng.choice(WHOLE)


def _duplicated(rng, doc, spots):
    parent_path, _key = rng.choice(spots)
    parent = _node(doc, parent_path)
    raw = json.dumps(doc, indent=2, ensure_ascii=False)
    if not isinstance(parent, dict) or not parent:
        return raw.encode()
    needle = json.dumps(rng.choice(list(parent))) + ": "
    at = raw.find(needle)
    return (raw[:at] + needle + json.dumps(rng.choice(SWAPS)) + ",\n" + raw[at:]).encode() if at >= 0 else raw.encode()


KINDS = {"misspell": _misspelled, "flip": _flipped, "delete": _deleted, "add": _added, "number": _renumbered,
         "lexical": _lexical, "whole": _whole, "duplicate": _duplicated}
WEIGHTS = {"misspell": 2, "flip": 2, "delete": 1, "add": 1, "number": 1, "lexical": 1, "whole": 1, "duplicate": 1}


def mutate(rng: random.Random, base) -> tuple[str, bytes]:
    doc = json.loads(json.dumps(base))
    kind = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
    out = KINDS[kind](rng, doc, list(_paths(doc)))
    return kind, out if isinstance(out, bytes) else json.dumps(out, indent=2, ensure_ascii=False).encode()


def _with_non_ascii(doc, rng: random.Random):
    strings = [(p, k) for p, k in _paths(doc) if isinstance(_node(doc, p)[k], str)]
    if strings:
        p, k = rng.choice(strings)
        _node(doc, p)[k] += "é"
    return doc


def mutations(docs: list, n: int, seed: int = 36) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    return [mutate(rng, docs[i % len(docs)]) for i in range(n)]
