"""What huggingface_hub's `upload_folder` does with each path of a folder, and which files of a
package are secrets: the rules `raipack publish` plans with, before anything is created on the Hub.

- `client_ignores(rel)`: the client skips the file (its default ignore patterns, matched with
  fnmatchcase as huggingface_hub matches them: `*` crosses `/`, a pattern ending in `/` gets `*`).
- `client_refuses(rel)`: the client raises ValueError for it, after the repository was created (a
  `..` segment, or a segment equal to a forbidden folder: `.git`, `.cache`).
- `secret_name(rel)`, `secret_in(data)`: a credential by its file name, or a token's shape in a
  small text file.

Data: pipeline/data/hub.json "client" (with the huggingface_hub source it is read from; a test holds
these functions against that source's functions) and "secrets".
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from functools import lru_cache

from raipack.data import load_data


def _hub() -> dict:
    return load_data("hub.json")


def _patterns(patterns) -> list[str]:
    return [p + "*" if p.endswith("/") else p for p in (p.replace("\\", "/") for p in patterns)]


def client_ignores(rel: str, extra=()) -> bool:
    """huggingface_hub's upload_folder skips `rel` (its default ignore patterns plus `extra`)."""
    return any(fnmatchcase(rel, p) for p in _patterns([*extra, *_hub()["client"]["ignore_patterns"]]))


def client_refuses(rel: str) -> str:
    """The segment for which huggingface_hub refuses to commit `rel` ("" when it takes it)."""
    path = rel[1:] if rel.startswith("/") else rel
    parts = path.split("/")
    if path == "." or ".." in parts:
        return ".."
    return next((f for f in _hub()["client"]["forbidden_folders"] if f in parts), "")


def secret_name(rel: str) -> str:
    """The secrets pattern `rel`'s name matches ("" for none): a pattern with a `/` matches the end
    of the path, one without matches the file's name."""
    name = rel.rsplit("/", 1)[-1]
    for pattern in _hub()["secrets"]["names"]:
        if "/" in pattern:
            if fnmatchcase(rel, pattern) or fnmatchcase(rel, "*/" + pattern):
                return pattern
        elif fnmatchcase(name, pattern):
            return pattern
    return ""


def content_limit() -> int:
    return _hub()["secrets"]["content_max_bytes"]


@lru_cache(maxsize=1)
def _content_rules() -> tuple:
    return tuple((rule["what"], re.compile(rule["regex"].encode("ascii"))) for rule in _hub()["secrets"]["content"])


def secret_in(data: bytes) -> str:
    """What kind of credential `data` holds ("" for none)."""
    return next((what for what, rx in _content_rules() if rx.search(data)), "")
