"""Command line: one small module per command; the only place that knows click.

Each module registers its commands on the group of `main.py`; importing them here is what makes
`raipack <command>` exist.
"""

from raipack.cli import batch, bench, build, cache, doctor, eval, info, lemonade, publish, report, run, tune, validate  # noqa: F401  (register the commands)
from raipack.cli.main import cli, main

__all__ = ["cli", "main"]
