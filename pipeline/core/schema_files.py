"""Where raipack's JSON Schemas are and how they load: the repo's top-level `schemas/` folder,
shipped as the data package `raipack.schemas` (the repo folder when that package is not installed),
each file read once per process, and the offline registry through which their `$ref`s resolve
among raipack's own schemas. core/schemas.py validates with them and words the errors."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from raipack.core.errors import UsageError

if TYPE_CHECKING:
    from referencing import Registry

PACKAGE = "raipack.schemas"
SUFFIX = ".schema.json"
REPO_DIR = Path(__file__).resolve().parents[2] / "schemas"


@lru_cache(maxsize=None)
def _folder():
    """Where the schema files are: the installed data package, else the repo."""
    try:
        return resources.files(PACKAGE)
    except ImportError:
        return REPO_DIR


def names() -> list[str]:
    """Names of the schemas raipack ships (`genai_config`, `manifest`, ...)."""
    return sorted(e.name[: -len(SUFFIX)] for e in _folder().iterdir() if e.name.endswith(SUFFIX))


@lru_cache(maxsize=None)
def _text(name: str) -> str:
    if name not in names():
        raise UsageError(f"there is no schema named {name!r}", f"choose one of: {', '.join(names())}")
    return _folder().joinpath(name + SUFFIX).read_text("utf-8")


def load(name: str) -> dict:
    """The schema `schemas/<name>.schema.json` as a fresh dict."""
    return json.loads(_text(name))


@lru_cache(maxsize=None)
def _documents() -> dict[str, dict]:
    """name → schema; the validators use these very objects."""
    return {name: load(name) for name in names()}


@lru_cache(maxsize=None)
def _registry() -> Registry:
    from referencing import Registry, Resource  # late: start-up time, loaded only when a document is validated

    return Registry().with_resources(
        (doc["$id"], Resource.from_contents(doc)) for doc in _documents().values()
    )


@lru_cache(maxsize=None)
def _base_of() -> dict[int, str]:
    """id() of every sub-schema → $id of the document holding it (to resolve local $refs)."""
    out: dict[int, str] = {}

    def walk(node, base):
        if isinstance(node, dict):
            out[id(node)] = base
            for value in node.values():
                walk(value, base)
        elif isinstance(node, list):
            for value in node:
                walk(value, base)

    for doc in _documents().values():
        walk(doc, doc["$id"])
    return out
