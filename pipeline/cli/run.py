"""`raipack run`: one prompt through the reference runtime."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from raipack.cli.main import cli


@cli.command("run")
@click.argument("package", type=click.Path(path_type=Path))
@click.option("--prompt", "-p", required=True, help="The user message.")
@click.option("--max-new-tokens", "-n", type=click.IntRange(1, 100000), default=64, show_default=True)
@click.option("--raw", is_flag=True, help="Do not apply the chat template.")
@click.option("--threads", type=click.IntRange(1, 256), help="CPU threads (default: onnxruntime's choice).")
@click.option("--sdk-version", help="Ryzen AI version whose max_prompt_length applies (default: the package's release).")
@click.option("--numerics", type=click.Choice(["float", "bfp16"]), default="float", show_default=True,
              help="bfp16: the NPU's BFP16 activations and bfloat16 KV cache, as Quark defines them (needs amd-quark).")
def run_cmd(package, prompt, **options):
    """Answer a prompt with a raipack package on the CPU reference runtime.

    Before loading, every weights file is checked against the sizes and hashes
    manifest.json records; no file outside the package, and no FIFO or device,
    is opened.

    \b
    Exit codes:
      0  answered
      1  the package cannot be run: a file is missing, corrupt, changed since
         the build or outside the package, or the prompt is longer than the
         package takes
      2  usage error: PACKAGE is not a folder, the prompt is not UTF-8 text,
         a bad option, --numerics bfp16 without amd-quark installed
    """
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.runtime.run import RunOptions, answer

    out = answer(package, prompt, RunOptions(**options))
    for note in out.notes:
        click.echo(note, err=True)
    click.echo(out.text)
    click.echo(out.stats, err=True)
    sys.exit(0)
