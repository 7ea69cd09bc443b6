"""`raipack batch`: a matrix of models x profiles x overrides, built as stage jobs on an executor."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from raipack.cli.main import cli
from raipack.core.env import OFFLINE, THREADS


@cli.command()
@click.argument("matrix", type=click.Path(path_type=Path))
@click.option("--executor", type=click.Choice(["local", "ray"]), help="Where stage jobs run: local worker processes (default) or a Ray cluster.")
@click.option("--address", help="The Ray cluster's head (host:port) for --executor ray; default: a Ray of this machine's own.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), help="Local executor: stage jobs at once, memory permitting (default 1).")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "junit"]), default="text", show_default=True, help="The report's format.")
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write the report to this file instead of stdout.")
@click.option("--max-entries", type=click.IntRange(min=1), help="Refuse a matrix of more entries than this (default 1000, pipeline/batch/data/limits.json).")
def batch(matrix, fmt, output, **options):
    """Build a matrix of models x profiles x recipe overrides (see `raipack schemas matrix`).

    Exit codes: 0 every entry built, 1 an entry failed, 2 a bad matrix or option."""
    os.environ.update(OFFLINE)
    for key, value in THREADS.items():
        os.environ.setdefault(key, value)
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.batch import report
    from raipack.batch.run import exit_code, run_batch  # late: as above
    from raipack.core.output import atomic_write_text  # late: as above

    def line(text: str) -> None:
        click.echo(text, err=True)

    doc = run_batch(matrix, line=line, warn=lambda t: click.secho(t, err=True, fg="yellow"), **options)  # executor, address, jobs, max_entries
    text = {"text": lambda d: report.table(d["entries"], d["jobs"], d.get("model_packages")) + "\n", "json": report.to_json, "junit": report.to_junit}[fmt](doc)
    if output:
        atomic_write_text(output, text)
        click.echo(report.table(doc["entries"], doc["jobs"], doc.get("model_packages")), err=True)
    else:
        click.echo(text, nl=False)
    sys.exit(exit_code(doc))
