"""`raipack publish`: a package's upload plan for the Hugging Face Hub, and the upload."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from raipack.cli.main import cli


@cli.command()
@click.argument("package", type=click.Path(path_type=Path))
@click.option("--repo", "repo_id", help="The Hub repository to upload to, OWNER/NAME (created if missing).")
@click.option("--dry-run", is_flag=True, help="Print the upload plan and upload nothing.")
@click.option("--private", is_flag=True, help="Create the repository as private.")
@click.option("--revision", help="The branch to commit to (default: main).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def publish(package, repo_id, dry_run, private, revision, as_json):
    """Upload PACKAGE to the Hugging Face Hub, or (--dry-run) print the plan: each file, its size,
    Git LFS or not, the model card's metadata, and what the Hub or raipack would refuse.

    Refused before anything is created: what the Hub or huggingface_hub refuses (files over its
    limits outside LFS, files under .cache/ or .git/), credentials files (.env, .netrc,
    .huggingface/token, ...) and tokens in small text files, a README front matter past raipack's
    bounds, a package that fails validation.

    Exit codes: 0 uploaded (or a plan the Hub takes), 1 refused (nothing uploaded), 2 usage error
    (no --repo, no huggingface_hub, no token), 3 no package at PACKAGE, 4 the Hub refused a request
    of the upload (HTTP 4xx: the token, the repository name), 5 the Hub could not be reached or
    failed during the upload (network, timeout, HTTP 429 or 5xx); as `raipack validate hf://...`."""
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.publish import as_text, upload, upload_plan

    plan = upload_plan(package, repo_id)
    click.echo(json.dumps(plan.to_dict(), indent=2, default=str) if as_json else as_text(plan, dry_run), nl=as_json)
    if dry_run or plan.refused:
        sys.exit(1 if plan.refused else 0)
    click.echo(f"uploaded: {upload(plan, private=private, revision=revision)}")
