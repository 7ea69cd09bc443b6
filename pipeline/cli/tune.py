"""`raipack tune`: change a package's length settings safely."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from raipack.cli.main import cli
from raipack.core.errors import UsageError
from raipack.core.output import use_color


@cli.command()
@click.argument("package", type=click.Path(path_type=Path))
@click.option("--max-length", type=click.IntRange(1, 1 << 20), help="New search.max_length (prompt + answer tokens).")
@click.option("--max-prompt", type=click.IntRange(1, 1 << 20), help="Longest prompt to serve; checked against the Ryzen AI version's max_prompt_length.")
@click.option("--chunk-size", type=click.IntRange(1, 1 << 20), help="New search.chunk_size; must be a prefill tier of the package.")
@click.option("--sdk-version", help="Ryzen AI version the package runs on (default: $RAIPACK_SDK_VERSION, the installed one, else the package's release).")
@click.option("--profile", default="auto", show_default=True)
@click.option("--dry-run", is_flag=True, help="Show the diff; write nothing.")
@click.option("--platform", type=click.Choice(["linux"]), help="Make the file edits AMD documents for running the package's release on Linux (and list the setup they need).")
def tune(package, dry_run, **settings):
    """Change a package's length settings in genai_config.json, consistently and safely."""
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.reporters import REPORTERS
    from raipack.tune import apply, plan, revalidate  # late: as above

    if settings["platform"]:
        if settings["max_length"] or settings["max_prompt"] or settings["chunk_size"]:
            raise UsageError("--platform linux makes AMD's Linux edits and takes no length option", "run raipack tune twice: once with --platform linux, once with the lengths")
        _linux(package, settings["profile"], dry_run)

    p = plan(package, settings["max_length"], settings["max_prompt"], settings["chunk_size"], settings["sdk_version"], settings["profile"])
    click.echo(f"Ryzen AI {p.sdk[0]} ({p.sdk[1]})")
    for name, old, new in p.changes:
        click.echo(f"  {name}: {old} -> {new}")
    if not p.changes:
        click.echo(f"nothing to change: {p.path} already has these settings")
        sys.exit(0)
    click.echo(p.diff(), nl=False)
    for note in p.notes:
        click.echo(note)
    if dry_run:
        click.echo("dry run: nothing written")
        sys.exit(0)
    backup = apply(p)
    click.echo(f"wrote {p.path} (backup: {backup.name})")
    result = revalidate(p)
    code = 1 if result.failed() else 0
    click.echo(REPORTERS["text"]([result], code, use_color(sys.stdout)), nl=False, color=True)  # escapes only where use_color said
    sys.exit(code)


def _linux(package, profile, dry_run):
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.reporters import REPORTERS
    from raipack.tune_linux import apply_linux, plan_linux, revalidate_linux  # late: as above

    p = plan_linux(package, profile)
    click.echo(f"Linux deployment of Ryzen AI {p.release} packages (profile {p.profile}; {p.source})")
    for edit in p.pending:
        click.echo(f"  {edit.file}: {edit.what}" + ("  [names your install: deployment/ copied into the folder you run from]" if edit.install_path else ""))
    if not p.pending:
        click.echo(f"  no file to edit: {p.root} runs on Linux as it is, or has AMD's edits already")
    if dry_run:
        click.echo("dry run: nothing written")
    else:
        for rel, backup in apply_linux(p):
            click.echo(f"wrote {p.root / rel} (backup: {backup.name})")
    if p.environment:
        click.echo("then, in the folder you run the program from:")
        for step in p.environment:
            click.echo(f"  - {step}")
    if dry_run:
        sys.exit(0)
    result = revalidate_linux(p)
    code = 1 if result.failed() else 0
    click.echo(REPORTERS["text"]([result], code, use_color(sys.stdout)), nl=False, color=True)  # escapes only where use_color said
    sys.exit(code)
