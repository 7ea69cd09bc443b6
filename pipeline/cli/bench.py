"""`raipack bench`: TTFT, tokens per second and peak memory per prompt length."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from raipack.cli.main import cli
from raipack.core.errors import UsageError


@cli.command("bench")
@click.argument("package", type=click.Path(path_type=Path))
@click.option("-l", "--lengths", help="Prompt lengths in tokens, comma-separated (default 2048,1024,512,256,128, those the package takes).")
@click.option("-g", "--gen-tokens", type=click.IntRange(1, 100000), default=128, show_default=True, help="Tokens generated after each prompt.")
@click.option("--runs", type=click.IntRange(1, 1000), default=3, show_default=True, help="Timed runs per length (median, min, max).")
@click.option("--warmup", type=click.IntRange(0, 100), default=1, show_default=True, help="Untimed runs first.")
@click.option("--backend", type=click.Choice(["npu", "reference", "oga"]), help="One backend only (default: reference and oga side by side).")
@click.option("--export", "export", type=click.Path(path_type=Path, file_okay=False, exists=True), help="The unfused export (default: found through manifest.json's lineage in the build cache).")
@click.option("--numerics", default=None,
              help="The reference backend's numerics, comma-separated: float, bfp16 (the NPU's BFP16 activations as Quark defines them; needs amd-quark), or float,bfp16 side by side. "
                   "Default: the device's, bfp16 for a package of an NPU or hybrid target (float without amd-quark), float for other targets.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "csv"]), default="text", show_default=True)
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), help="Write here instead of stdout.")
def bench_cmd(package, lengths, fmt, output, **measure):
    """Measure a package the way AMD's model_benchmark does: per prompt length, the
    time to first token, decode tokens per second and peak memory, with the backend
    that really ran; by default the package (reference runtime) beside its unfused
    export (onnxruntime-genai) and the ratio of every figure.

    \b
    Exit codes:
      0  measured
      1  a backend cannot run here (--backend npu without the Ryzen AI runtime,
         a package that does not run)
      2  usage error: PACKAGE is not a folder, a length that is not a positive
         whole number or is above the package's prompt limit, a bad option,
         --numerics bfp16 without amd-quark
      3  the folder holds no model package
    """
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.benchmark import Runs, bench, make_plan, parse_lengths, parse_numerics
    from raipack.benchmark.render import as_csv, as_json, as_text  # late: as above
    from raipack.core.output import atomic_write_text  # late: as above

    asked = parse_lengths(lengths) if lengths is not None else None
    if measure["numerics"] is not None:  # not given: the device's numerics (raipack.benchmark.make_plan)
        numerics_names(measure["numerics"])
    runs = Runs(measure["gen_tokens"], measure["runs"], measure["warmup"])
    plan = make_plan(package, asked, runs, measure["backend"], measure["export"], parse_numerics(measure["numerics"]))
    for backend_name, folder in plan.backends:
        click.echo(f"measuring {backend_name} on {folder} ...", err=True)
    doc = bench(plan)
    text = {"text": as_text, "json": as_json, "csv": as_csv}[fmt](doc)
    if output:
        atomic_write_text(output, text)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=False)
    sys.exit(0)


def numerics_names(text: str) -> list[str]:
    """The comma-separated names of --numerics, each non-empty: "" or ",,," names no numerics (it once ran
    as float without a word), and is refused as a usage error (exit 2)."""
    names = [t.strip() for t in str(text).split(",")]
    if not all(names):
        raise UsageError(f"--numerics is {text!r}, which has an empty name; expected float, bfp16 or float,bfp16",
                         "give one or more of float and bfp16, comma-separated, or leave --numerics out for the device's (bfp16 for an NPU package)")
    return names
