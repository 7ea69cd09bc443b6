"""What every stage run of one build shares, passed as one typed value instead of a dozen parameters:
the recipe and its target profile, where the cache is, how progress and warnings are shown, the
hand-over standing in for earlier stages, and the stage outputs (and reports) made so far."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from raipack.builder.handover import Handover
from raipack.builder.progress import Progress
from raipack.builder.recipe import Recipe
from raipack.npu.spec import Profile


def _quiet() -> Progress:
    return Progress("quiet", stream=io.StringIO())


@dataclass
class BuildContext:
    recipe: Recipe
    profile: Profile
    cache_root: Path  # resolved: cache.cache_root() when the caller named none
    progress: Progress = field(default_factory=_quiet)
    verify_cache: bool = False  # hash every cache hit against its manifest
    inputs: Handover | None = None  # a hand-over (pipeline/builder/handover.py) carrying earlier stages' outputs
    outputs: dict[str, Path] = field(default_factory=dict)  # stage name -> its output folder, as the build goes
    reports: dict[str, dict] = field(default_factory=dict)  # stage name -> its report
    started: float = field(default_factory=time.perf_counter)
    warn: Callable[[str], None] | None = None  # a warning line; default: the progress display, in yellow
    ignore_memory: bool = False  # run a stage whose memory estimate exceeds the free memory instead of refusing it

    def __post_init__(self):
        if self.warn is None:
            self.warn = lambda line: self.progress.line(line, style="yellow")
