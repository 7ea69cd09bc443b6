"""`raipack build` as one use-case call: a typed request (what the command line parsed) in, a BuildResult out.
The command line (pipeline/cli/build.py) only parses options into a BuildRequest and prints the summary."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from raipack.builder import handover, stages
from raipack.builder.progress import Progress
from raipack.builder.recipe import load
from raipack.builder.runner import BuildOptions, BuildResult, build
from raipack.core.env import OFFLINE, THREADS
from raipack.core.errors import RaipackError
from raipack.npu import profile as profiles


@dataclass(frozen=True)
class BuildRequest:
    recipe_path: Path | None = None
    flags: dict = field(default_factory=dict)  # in the recipe's shape: fields, and {stage: {option: value}}; None = not given
    options: BuildOptions = field(default_factory=BuildOptions)
    handover_dir: Path | None = None  # after an --until build, write the hand-over here
    inputs_dir: Path | None = None  # a hand-over standing in for the earlier stages
    mode: str = "auto"  # progress display: auto | plain | quiet | json
    verbose: bool = False  # also show the libraries' own output live


def run_build(request: BuildRequest) -> BuildResult:
    """Load the recipe (or the hand-over's), run the build, write the hand-over if asked; progress lines as it goes."""
    os.environ.update(OFFLINE)  # raipack never downloads a model, and keeps the libraries' own bars quiet
    for key, value in THREADS.items():  # before anything loads torch; a user's own setting wins
        os.environ.setdefault(key, value)


    progress = Progress(request.mode, verbose=request.verbose)
    carried = handover.read(request.inputs_dir) if request.inputs_dir is not None else None
    recipe = (handover.recipe_from(carried, request.recipe_path, request.flags) if carried
              else load(Path(request.recipe_path) if request.recipe_path else None, request.flags))
    if request.handover_dir is not None:
        handover.check_destination(request.handover_dir, request.options.until or stages.order()[-1])
    if carried and (drift := handover.profile_drift(carried, profiles.get(recipe.profile))):
        progress.line(drift, "yellow")
    source = f" from the hand-over {request.inputs_dir}" if carried else " (the example model)" if recipe.is_example else f" from {recipe.model}"
    progress.line(f"raipack build: {recipe.model_name()} → profile {recipe.profile}{source}")
    try:
        result = build(recipe, replace(request.options, progress=progress, inputs=carried))
        if request.handover_dir is not None:
            progress.line(f"hand-over written: {handover.write(request.handover_dir, result)} (copy it whole; finish with `raipack build --inputs <folder>`)")
    except RaipackError:
        progress.event("build", status="failed")
        raise
    rep = result.report()
    progress.event("build", status="done", package=rep["package"], seconds=rep["seconds"])
    if result.stages and all(s.status == "cached" for s in result.stages):
        progress.line("nothing to do: every stage is cached (use --force to rebuild)")
    return result
