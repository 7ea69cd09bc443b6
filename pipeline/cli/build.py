"""`raipack build`: parse the options, run the pipeline, print the summary a user reads at the end."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from raipack.cli.main import cli
from raipack.core.env import OFFLINE, THREADS
from raipack.core.errors import RaipackError, UsageError


@cli.command()
@click.argument("model_dir", required=False)
@click.option("--recipe", type=click.Path(path_type=Path), help="A TOML recipe (see `raipack schemas recipe`); flags override it.")
@click.option("--profile", help="Target profile, e.g. 1.8.0-npu-16K (default) or 1.8.0-npu-4K.")
@click.option("--name", help="Model name in the package folder name.")
@click.option("--output", "-o", help="Folder that receives the package (default: build).")
@click.option("--until", help="Stop after this stage (source, quantize, export, fuse, smoke).")
@click.option("--from", "from_", help="Rebuild from this stage on; earlier stages come from the cache (or from --inputs).")
@click.option("--handover", type=click.Path(path_type=Path), help="After an --until build, copy the outputs the remaining stages need, with handover.json, into this new folder (to finish the build on another machine).")
@click.option("--inputs", type=click.Path(path_type=Path), help="A hand-over folder (--handover): its recipe and checked outputs stand in for the stages before --from (default: the first stage it does not carry).")
@click.option("--force", is_flag=True, help="Rebuild every stage, ignoring the cache.")
@click.option("--ignore-memory", is_flag=True, help="Run a stage whose memory estimate exceeds the free memory instead of refusing it.")
@click.option("--verify-cache", is_flag=True, help="Hash every cached output against its manifest before using it (else only when its files' stat changed).")
@click.option("--algorithm", type=click.Choice(["awq", "gptq", "rtn"]), help="Quantization algorithm (default awq).")
@click.option("--group-size", help="Quantization group size: 128, 64, 32 or auto.")
@click.option("--num-samples", type=int, help="Calibration samples.")
@click.option("--seq-len", type=int, help="Calibration sequence length.")
@click.option("--calib-data", help="Calibration text (.txt) or JSON lines (.jsonl, {\"text\": ...}).")
@click.option("--backend", type=click.Choice(["auto", "reference", "ryzenai-sdk"]), help="Fuse backend.")
@click.option("--smoke", "smoke_tiers", type=click.Choice(["scaled", "all"]), help="Smoke prefill tiers: every one up to 1024 and the largest (scaled, default), or all.")
@click.option("--require-npu", is_flag=True, default=None, help="Fail the smoke stage instead of falling back to the CPU reference runtime.")
@click.option("--trust-remote-code", is_flag=True, default=None, help="Allow a model that needs its own Python code.")
@click.option("--quiet", "-q", is_flag=True, help="Only errors and the final summary.")
@click.option("--json-log", is_flag=True, help="Progress as JSON lines on stderr (for CI).")
@click.option("--verbose", "-v", is_flag=True, help="Also show the libraries' own output live (always kept in each stage's log.txt).")
def build(model_dir, recipe, profile, name, output, until, from_, handover, inputs, force, ignore_memory, verify_cache, algorithm, group_size, num_samples, seq_len, calib_data, backend, smoke_tiers, require_npu, trust_remote_code, quiet, json_log, verbose):
    """Build a Ryzen AI NPU package (default: the example model, SmolLM2-135M-Instruct)."""
    if group_size is not None and group_size != "auto":
        if not group_size.isdigit():
            raise UsageError(f"--group-size {group_size!r} is not a number or auto", "use 128, 64, 32 or auto")
        group_size = int(group_size)
    overrides = {"model": model_dir, "profile": profile, "name": name, "output": output, "trust_remote_code": trust_remote_code,
                 "quantize.algorithm": algorithm, "quantize.group_size": group_size, "quantize.num_samples": num_samples,
                 "quantize.seq_len": seq_len, "quantize.calib_data": calib_data, "fuse.backend": backend, "smoke.require_npu": require_npu,
                 "smoke.tiers": smoke_tiers}
    mode = "json" if json_log else "quiet" if quiet else "auto"
    sys.exit(run_build(recipe, overrides, until=until, from_=from_, force=force, mode=mode, verify_cache=verify_cache, verbose=verbose,
                       handover_dir=handover, inputs_dir=inputs, ignore_memory=ignore_memory))


def run_build(recipe_path, overrides: dict, *, until=None, from_=None, force=False, mode="auto", verify_cache=False, verbose=False,
              handover_dir=None, inputs_dir=None, ignore_memory=False) -> int:
    os.environ.update(OFFLINE)  # raipack never downloads a model, and keeps the libraries' own bars quiet
    for key, value in THREADS.items():  # before anything loads torch; a user's own setting wins
        os.environ.setdefault(key, value)

    from raipack.builder import handover, stages
    from raipack.builder.progress import Progress
    from raipack.builder.recipe import load
    from raipack.builder.runner import build
    from raipack.npu import profile as profiles

    progress = Progress(mode, verbose=verbose)
    carried = handover.read(inputs_dir) if inputs_dir is not None else None
    recipe = handover.recipe_from(carried, recipe_path, overrides) if carried else load(Path(recipe_path) if recipe_path else None, overrides)
    if handover_dir is not None:
        handover.check_destination(handover_dir, until or stages.order()[-1])
    if carried and (drift := handover.profile_drift(carried, profiles.get(recipe.profile))):
        progress.line(drift, "yellow")
    source = f" from the hand-over {inputs_dir}" if carried else " (the example model)" if recipe.is_example else f" from {recipe.model}"
    progress.line(f"raipack build: {recipe.model_name()} → profile {recipe.profile}{source}")
    try:
        result = build(recipe, until=until, from_=from_, force=force, progress=progress, verify_cache=verify_cache, inputs=carried,
                       ignore_memory=ignore_memory)
        if handover_dir is not None:
            progress.line(f"hand-over written: {handover.write(handover_dir, result)} (copy it whole; finish with `raipack build --inputs <folder>`)")
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
