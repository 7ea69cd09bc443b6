"""The stage contract and the registry that finds stages by name."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pipeline.core.errors import UsageError
from pipeline.data import load_data


@dataclass(frozen=True)
class Stage:
    """One build step.

    `run(job)` reads `job.inputs` (upstream outputs by stage name), writes
    into `job.workdir` and returns its report (JSON-able). The runner then
    validates `job.workdir` against `output_profile`, writes the manifest and
    renames the folder into place.
    """

    name: str
    version: str
    config: type  # a dataclass; unknown keys are refused
    inputs: tuple[str, ...]
    output_profile: Callable[["Job"], str | None]  # None: the output is a report the stage checked itself
    run: Callable[["Job"], dict]
    tools: tuple[str, ...] = ()  # distributions whose versions enter the cache key
    kind: str = ""  # the manifest's kind
    profile_keys: tuple[str, ...] | None = None  # the target profile's keys the output depends on (None: all of it)
    preflight: Callable[[Any, dict], None] | None = None  # (config, target profile): refuse before any stage runs

    def profile_part(self, profile: dict) -> dict:
        """What of the target profile enters this stage's cache key."""
        return profile if self.profile_keys is None else {k: profile.get(k) for k in self.profile_keys}


@dataclass
class Job:
    """What a stage's run() gets."""

    stage: Stage
    config: Any
    inputs: dict[str, Path]
    workdir: Path
    profile: dict  # the target package profile
    recipe: Any
    progress: Any
    reports: dict[str, dict] = field(default_factory=dict)  # earlier stages' reports


def order() -> list[str]:
    return list(load_data("stages.json")["order"])


def get(name: str) -> Stage:
    modules = load_data("stages.json")["modules"]
    if name not in modules:
        raise UsageError(f"no stage named {name!r}", f"stages are: {', '.join(order())}")
    return importlib.import_module(modules[name]).STAGE
