"""The build's stages: found by name from pipeline/data/stages.json, known to the runner by kind.

Each module named there defines STAGE (pipeline/core/stage.py: the Stage/Job contract). The runner
never names a stage: it asks for the stage of a kind — the one a user's model folder stands in for,
the one whose output becomes the package.
"""

from __future__ import annotations

import importlib

from raipack.core.errors import UsageError
from raipack.core.stage import Stage
from raipack.data import load_data

MODEL_KIND = "source"  # a user's model folder replaces the output of the stage of this kind
PACKAGE_KIND = "package"  # the output of the stage of this kind is assembled into the package


def order() -> list[str]:
    return list(load_data("stages.json")["order"])


def get(name: str) -> Stage:
    modules = load_data("stages.json")["modules"]
    if name not in modules:
        raise UsageError(f"no stage named {name!r}", f"stages are: {', '.join(order())}")
    return importlib.import_module(modules[name]).STAGE


def of_kind(kind: str) -> str:
    """The name of the one stage that declares `kind`."""
    names = [name for name in order() if get(name).kind == kind]
    if len(names) != 1:
        raise RuntimeError(f"pipeline/data/stages.json: {len(names)} stages of kind {kind!r}, expected one")
    return names[0]
