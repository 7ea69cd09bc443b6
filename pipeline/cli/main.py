"""The `raipack` command group and the one place that turns errors into lines and exit codes.

Exit codes: 0 clean, 1 error-level findings (or a failed build), 2 usage
error, 3 nothing to validate.
"""

from __future__ import annotations

import os
import sys

import click

from raipack import __version__
from raipack.core.errors import RaipackError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="raipack")
def cli():
    """Build and check model packages for AMD Ryzen AI NPUs."""


def error(exc: RaipackError):
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.core.textsafe import safe

    click.echo(f"ERROR: {safe(str(exc), 2000)}", err=True)
    if exc.hint:
        click.echo(f"  hint: {safe(exc.hint, 2000)}", err=True)


def main(argv=None):
    try:
        cli.main(args=argv, prog_name="raipack", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2 if isinstance(exc, click.UsageError) else exc.exit_code)
    except RaipackError as exc:
        error(exc)
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    sys.exit(0)


