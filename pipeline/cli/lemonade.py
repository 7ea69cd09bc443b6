"""`raipack lemonade register`: a package made selectable in lemonade (its user_models.json)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from raipack.cli.main import cli


@cli.group()
def lemonade():
    """lemonade, the local LLM server: register packages as its user models."""


@lemonade.command()
@click.argument("package", type=click.Path(path_type=Path))
@click.option("--name", help="The model's name in lemonade, shown as user.NAME (default: the package folder's name).")
@click.option("--labels", multiple=True, help="Labels for lemonade's model list, comma-separated or repeated (reasoning, vision, ...).")
@click.option("--config-dir", type=click.Path(path_type=Path), help="lemonade's config folder (default: where lemonade looks on this platform).")
@click.option("--dry-run", is_flag=True, help="Print the entry and the file it would go into; write nothing.")
@click.option("--allow-reference", is_flag=True, help="Register a raipack reference package, which AMD's runtime cannot load.")
def register(package, name, labels, config_dir, dry_run, allow_reference):
    """Write or update PACKAGE's entry in lemonade's user_models.json (atomically), recipe ryzenai-llm.

    Concurrent registrations wait for each other (a lock file beside the registry); a symbolic link
    at user_models.json is written through (it stays a link).

    Exit codes: 0 registered (or printed), 1 refused (a reference package, a failing package, a
    registry that is not a plain JSON object file: a FIFO, NaN, a duplicate key, ...; a config folder
    that cannot be created), 2 usage error, 3 no package at PACKAGE."""
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.core.textsafe import PATH_LIMIT, safe
    from raipack.lemonade import register as do_register  # late: as above

    wanted = [label.strip() for value in labels for label in value.split(",") if label.strip()]
    reg = do_register(package, name, wanted, config=config_dir, dry_run=dry_run, allow_reference=allow_reference)
    click.echo(json.dumps({reg.name: reg.entry}, indent=2))
    verb = "would be written to" if dry_run else "replaced in" if reg.replaced else "written to"
    click.echo(f"user.{safe(reg.name)} {verb} {safe(str(reg.file), PATH_LIMIT)}" + (" (dry run)" if dry_run else ""), err=True)
