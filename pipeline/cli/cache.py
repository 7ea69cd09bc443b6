"""`raipack cache ls|clear`: the stage cache."""

from __future__ import annotations

import click

from raipack.cli.main import cli
from raipack.core.errors import UsageError


@cli.group()
def cache():
    """The stage cache ($RAIPACK_CACHE, else the platform's cache folder)."""


@cache.command("ls")
def cache_ls():
    """List cached stage outputs."""
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.builder import cache as c

    rows = c.entries()
    click.echo(f"cache: {c.cache_root()}")
    for r in rows:
        click.echo(f"{r['stage']:9} {r['key']}  {r['bytes'] / 2**20:9.1f} MiB  {'complete' if r['complete'] else 'incomplete'}  {r['created']}")
    if not rows:
        click.echo("(empty)")


@cache.command("clear")
@click.argument("stage", required=False)
@click.option("--stale", is_flag=True, help="Remove only the staging folders of builds that are gone (killed); keep every output and running builds.")
def cache_clear(stage, stale):
    """Remove cached outputs (of one stage, or all)."""
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.builder import cache as c

    if stale:
        if stage:
            raise UsageError("cache clear --stale takes no STAGE: it sweeps the whole cache", "run `raipack cache clear --stale`, or `raipack cache clear STAGE` to remove that stage's outputs")
        # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
        from raipack.builder.staging import sweep_cache

        gone = sweep_cache(c.cache_root())
        click.echo(f"removed {len(gone)} staging folder{'s' if len(gone) != 1 else ''} of killed builds from {c.cache_root()}")
        return
    n = c.clear(stage)
    click.echo(f"removed {n} cached output{'s' if n != 1 else ''} from {c.cache_root()}")
