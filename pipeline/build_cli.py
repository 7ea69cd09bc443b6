"""`raipack build`: runs the pipeline and prints the summary a user reads at the end."""

from __future__ import annotations

from pathlib import Path

from .errors import RaipackError
from .progress import Progress
from .recipe import load
from .runner import build


OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false",
           "QUARK_LOG_LEVEL": "warning", "TQDM_DISABLE": "1"}


def run_build(recipe_path, overrides: dict, *, until=None, from_=None, force=False, mode="auto", verify_cache=False) -> int:
    import os

    import click

    os.environ.update(OFFLINE)  # raipack never downloads a model, and keeps the libraries' own bars quiet

    progress = Progress(mode)
    recipe = load(Path(recipe_path) if recipe_path else None, overrides)
    progress.line(f"raipack build: {recipe.model_name()} → profile {recipe.profile}" + (" (the example model)" if recipe.is_example else f" from {recipe.model}"))
    try:
        result = build(recipe, until=until, from_=from_, force=force, progress=progress, verify_cache=verify_cache)
    except RaipackError:
        progress.event("build", status="failed")
        raise
    rep = result.report()
    progress.event("build", status="done", package=rep["package"], seconds=rep["seconds"])
    cached = sum(1 for s in result.stages if s.status == "cached")
    if result.stages and cached == len(result.stages):
        progress.line("nothing to do: every stage is cached (use --force to rebuild)")
    if mode == "json":
        return 0
    if result.package:
        click.echo(f"\npackage   {result.package}")
        click.echo(f"report    {result.package / 'report.json'}")
        click.echo(f"validate  raipack validate {result.package}")
        click.echo(f"run       raipack run {result.package} --prompt \"What is the capital of France?\"")
    else:
        last = result.stages[-1] if result.stages else None
        if last:
            click.echo(f"\n{last.name} output  {last.path}")
    click.echo(f"done in {result.seconds:.1f} s")
    return 0
