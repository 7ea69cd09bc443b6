"""`raipack doctor`: will this package run here, and if not, why?"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from raipack.cli.main import cli


@cli.command()
@click.argument("package", required=False, type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def doctor(package, fmt):
    """Say whether this machine can run PACKAGE on the NPU (or any NPU package), and what to fix.

    Exit codes: 0 ready to run here, 1 will not run here, 3 no package at PACKAGE."""
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.doctor import as_json, as_text
    from raipack.doctor import doctor as run_doctor  # late: as above

    report = run_doctor(package)
    click.echo(as_json(report) if fmt == "json" else as_text(report), nl=fmt == "json")
    sys.exit(0 if report.ready else 1)
