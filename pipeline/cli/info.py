"""`raipack schemas`, `checks` and `profiles`: what raipack knows, printed."""

from __future__ import annotations

import json

import click

from raipack.cli.main import cli
from raipack.core.errors import UsageError


@cli.command()
@click.argument("name", required=False)
def schemas(name):
    """List the JSON Schemas, or print one."""
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.core import schemas as s

    if name is None:
        for n in s.names():
            click.echo(f"{n:20} {s.load(n).get('title', '')}")
        return
    name = name.removesuffix(".schema.json").removesuffix(".json")
    if name not in s.names():
        raise UsageError(f"no schema named {name!r}", f"choose one of: {', '.join(s.names())}")
    click.echo(json.dumps(s.load(name), indent=2))


@cli.command()
@click.argument("ids", nargs=-1)
def checks(ids):
    """List the checks with their ids, severities and docs."""
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.checks import load_all
    from raipack.data import load_data  # late: as above

    evidence = load_data("check_evidence.json")["rules"]
    specs = [s for s in load_all().values() if not ids or any(s.id.startswith(i) or s.name == i for i in ids)]
    if ids and not specs:
        raise UsageError(f"no check matches {' '.join(ids)}", "run `raipack checks` to list them")
    for spec in specs:
        click.echo(f"{spec.id} {spec.name} [{spec.severity}]{' (with --' + spec.needs.replace('_', '-') + ')' if spec.needs else ''}")
        for line in spec.doc.splitlines():
            click.echo(f"    {line}")
        click.echo(f"    At run time ({evidence[spec.id]['effect']}): {evidence[spec.id]['consequence']}")
        click.echo(f"    Evidence: {evidence[spec.id]['evidence']}")


@cli.command()
@click.argument("profile_id", required=False)
def profiles(profile_id):
    """List the profiles (package generations), or print one."""
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.npu import profile as p

    if profile_id:
        click.echo(json.dumps(p.get(profile_id).document(), indent=2))
        return
    for prof in p.all_profiles().values():
        click.echo(f"{prof.id:16} {prof.title}")
