"""`raipack report`: the visual report (report.html) of any package."""

from __future__ import annotations

from pathlib import Path

import click

from raipack.cli.main import cli


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--output", "-o", type=click.Path(path_type=Path), help="The HTML file to write (atomically). Default: report.html in the current folder, never inside PATH.")
@click.option("--bench", "bench", type=click.Path(path_type=Path), help="`raipack bench --format json` results (default: PATH/bench.json when present).")
@click.option("--eval", "evaluation", type=click.Path(path_type=Path), help="`raipack eval --output` results (default: PATH/eval.json when present).")
def report(path, output, bench, evaluation):
    """Write one self-contained HTML page about a package: build timeline, quality, speed, tiers, findings.

    Exit codes: 0 written (whatever the findings), 2 bad input or option, 3 PATH holds no package."""
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.report.page import write_report

    written = write_report(path, output, bench, evaluation)
    click.echo(f"wrote {written}")
