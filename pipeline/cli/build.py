"""`raipack build`: parse the options into a typed request, call the use case (pipeline/builder/request.py),
print the summary a user reads at the end."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from raipack.cli.main import cli
from raipack.core.errors import UsageError


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
def build(**options):
    """Build a Ryzen AI NPU package (default: the example model, SmolLM2-135M-Instruct)."""
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.builder.request import run_build

    request = build_request(options)
    sys.exit(summary(run_build(request), request.mode))


STAGE_FLAGS = {"quantize": ("algorithm", "group_size", "num_samples", "seq_len", "calib_data"), "fuse": ("backend",), "smoke": ("require_npu",)}


def build_request(options: dict):
    """The BuildRequest of the command's options (one keyword per option, as click passes them)."""
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.builder.request import BuildRequest
    from raipack.builder.runner import BuildOptions  # late: as above

    group_size = options["group_size"]
    if group_size is not None and group_size != "auto":
        if not group_size.isdigit():
            raise UsageError(f"--group-size {group_size!r} is not a number or auto", "use 128, 64, 32 or auto")
        options = {**options, "group_size": int(group_size)}
    flags = {"model": options["model_dir"], **{k: options[k] for k in ("profile", "name", "output", "trust_remote_code")},
             **{table: {k: options[k] for k in keys} for table, keys in STAGE_FLAGS.items()}}
    mode = "json" if options["json_log"] else "quiet" if options["quiet"] else "auto"
    flags["smoke"]["tiers"] = options["smoke_tiers"]
    run = BuildOptions(until=options["until"], from_=options["from_"], force=options["force"], verify_cache=options["verify_cache"],
                       ignore_memory=options["ignore_memory"])
    return BuildRequest(options["recipe"], flags, run, options["handover"], options["inputs"], mode, options["verbose"])


def summary(result, mode: str) -> int:
    """Print where the package is and what to do with it (nothing in json mode); the exit code."""
    if mode == "json":
        return 0
    from raipack.report.chain import chain_lines  # late: the command line imports its use cases when they run (start-up time)

    if result.package:
        click.echo(f"\npackage   {result.package}")
        click.echo(f"report    {result.package / 'report.json'}")
        click.echo(f"validate  raipack validate {result.package}")
        click.echo(f"run       raipack run {result.package} --prompt \"What is the capital of France?\"")
        for line in chain_lines([{"name": s.name, "report": s.report} for s in result.stages]):  # source → ... → package (BFP16)
            click.echo(line)
    else:
        last = result.stages[-1] if result.stages else None
        if last:
            click.echo(f"\n{last.name} output  {last.path}")
    click.echo(f"done in {result.seconds:.1f} s")
    return 0
