"""Data files shipped with raipack (file roles, known provider options, ...)."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=None)
def load_data(name: str, package: str = "pipeline.data"):
    """Parse a JSON data file shipped inside `package`."""
    return json.loads(resources.files(package).joinpath(name).read_text("utf-8"))
