"""`raipack validate` and `raipack inspect`: check and summarise package folders."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from raipack.cli.main import cli, error
from raipack.core.errors import RaipackError, UsageError
from raipack.core.output import atomic_write_text, use_color
from raipack.data import load_data

WORST_FIRST = (1, 4, 5, 3)  # the exit code of a run of many packages: findings, the Hub refused, the Hub unreachable, nothing to validate


def _ids(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


@cli.command()
@click.argument("paths", nargs=-1)
@click.option("--profile", default="auto", show_default=True, help="Profile id (see `raipack profiles`), or auto to detect it.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "junit", "sarif"]), default="text", show_default=True)
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write the report here (atomically); the text summary still goes to stdout.")
@click.option("--strict", is_flag=True, help="Warnings fail the run too.")
@click.option("--sarif-root", type=click.Path(path_type=Path, file_okay=False), help="With --format sarif: write file locations relative to this folder (the repository root GitHub code scanning reads them against).")
@click.option("--for", "destination", type=click.Choice(sorted(load_data("hub.json")["destinations"])), help="Where the package goes next: hub makes what the Hugging Face Hub refuses (RP110) an error.")
@click.option("--strict-advice", is_flag=True, help="Advice fails the run too.")
@click.option("--select", help="Only these check ids or prefixes, comma-separated (RP1,RP202).")
@click.option("--ignore", help="Skip these check ids or prefixes, comma-separated.")
@click.option("--verify-hashes", is_flag=True, help="Hash every file against manifest.json or its Git LFS oid.")
@click.option("--jobs", "-j", type=click.IntRange(1, 256), help="Validate N packages at once in worker processes (default: one at a time); with one package, threads for --verify-hashes (default: every core).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True, help="ray: each package a task on a Ray cluster (needs the cluster extra; every node must see the paths).")
@click.option("--address", help="The Ray cluster to use with --executor ray (host:port, or auto); default: a local Ray for this run.")
@click.option("--platform", type=click.Choice(["windows", "linux"]), help="Where the package is to run; linux: also the edits AMD documents for running its release's packages on Linux (RP407).")
@click.option("--revision", help="The branch, tag or commit of a Hugging Face cache repository folder (models--org--name) or hf:// repository; default main.")
@click.option("--hf-cache", is_flag=True, help="Validate every model in the Hugging Face cache (HF_HUB_CACHE, HF_HOME/hub or ~/.cache/huggingface/hub, as huggingface_hub finds it).")
@click.option("--lemonade", is_flag=True, help="Validate every ryzenai-llm model lemonade knows (its server_models.json and the user's user_models.json), from lemonade's model folder, its local folder or the Hub, and print one table.")
@click.option("--lemonade-models", type=click.Path(path_type=Path, dir_okay=False), help="With --lemonade: lemonade's built-in registry, server_models.json (default: found under lemonade's install folders).")
@click.option("--lemonade-config", type=click.Path(path_type=Path, file_okay=False), help="With --lemonade: lemonade's config folder, holding user_models.json and config.json (default: found as lemonade finds it).")
def validate(paths, fmt, output, strict, strict_advice, **options):
    """Check model packages against their profile's schemas and rules.

    A PATH is a package folder; a folder of package folders (a zoo) stands for each of its packages; a Hugging
    Face cache snapshot, a models--org--name folder (its refs/main, or --revision) or a cache root (each
    cached model) is read where it lies; hf://org/name[@revision] is a Hub repository judged from its file
    list and small files, nothing large downloaded. One report covers all.

    Exit codes: 0 clean, 1 error findings, 2 usage error, 3 nothing to validate, 4 the Hub refused the repository
    (missing, private, gated, no such revision), 5 the Hub could not be asked (network, rate limit)."""
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.reporters import REPORTERS

    outcomes, table = _outcomes(list(paths), options)
    sarif_root = options["sarif_root"]
    results, codes = [], []
    for outcome in outcomes:
        if isinstance(outcome, UsageError):
            raise outcome
        if isinstance(outcome, RaipackError):
            if table is None:  # the lemonade table says it on the model's row
                error(outcome)
            codes.append(outcome.exit_code)
            continue
        results.append(outcome)
        codes.append(1 if outcome.failed(strict, strict_advice) else 0)
    code = next((c for c in WORST_FIRST if c in codes), 0)
    extra = {"root": str(sarif_root)} if fmt == "sarif" and sarif_root else {}
    report = REPORTERS[fmt](results, code, use_color(sys.stdout) if fmt == "text" and not output else False, **extra)
    if output:
        atomic_write_text(output, report)
        if fmt != "text":
            click.echo(REPORTERS["text"](results, code, use_color(sys.stdout)), nl=False, color=True)
    else:
        click.echo(report, nl=False, color=True)  # color=True: click keeps the escapes use_color chose (FORCE_COLOR into a pipe)
    if table is not None and fmt == "text":
        click.echo(table, nl=False)
    sys.exit(code)


def _outcomes(paths: list, options: dict):
    """(every outcome, the lemonade table or None) for the command's PATHs, --hf-cache or --lemonade."""
    lemonade, registry, config = (options.pop(k) for k in ("lemonade", "lemonade_models", "lemonade_config"))
    if not lemonade:
        if registry or config:
            raise UsageError("--lemonade-models and --lemonade-config go with --lemonade", "add --lemonade")
        paths += _cache_roots(options)
        if not paths:
            raise UsageError("give a package to validate: a PATH, hf://org/name, --hf-cache or --lemonade", "raipack validate PATH")
        return _validate_all(paths, options), None
    if paths or options["hf_cache"]:
        raise UsageError("--lemonade validates the models lemonade knows; it takes no PATH and no --hf-cache", "run raipack validate twice")
    from raipack import lemonade_models as lm  # late: start-up time: the use cases are imported when a command uses them

    found = lm.locate(lm.models(registry, config), lm.models_dir(config))
    rows = lm.validate_models(found, options["jobs"] or 1, select=_ids(options["select"]), ignore=_ids(options["ignore"]),
                              verify_hashes=options["verify_hashes"], platform=options["platform"])
    from raipack.validate import for_destination  # late: start-up time (as above)

    outcomes = for_destination([outcome for _, outcome in rows], options["destination"])
    return outcomes, lm.table([(model, outcome) for (model, _), outcome in zip(rows, outcomes)])


def _validate_all(paths, options: dict):
    """Every outcome of validate_all for the command's selection and executor options."""
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.validate import for_destination, validate_all

    address, executor = options["address"], options["executor"]
    if address and executor != "ray":
        raise UsageError("--address names a Ray cluster and needs --executor ray", "add --executor ray, or leave out --address")
    pool = _ray_executor(address) if executor == "ray" else None
    try:
        return for_destination(validate_all(paths, options["profile"], jobs=options["jobs"] or 1, executor=pool,
                                            select=_ids(options["select"]), ignore=_ids(options["ignore"]), verify_hashes=options["verify_hashes"],
                                            platform=options["platform"], revision=options["revision"]), options["destination"])
    finally:
        if pool is not None:
            pool.shutdown()


def _cache_roots(options: dict) -> list[str]:
    """--hf-cache: the cache folder huggingface_hub uses here."""
    if not options.pop("hf_cache"):
        return []
    from raipack.places.hfcache import default_root  # late: the hub extra, only for --hf-cache

    root = default_root()
    if not root.is_dir():
        raise UsageError(f"the Hugging Face cache {root} does not exist, so nothing is cached", "download a model first (hf download ORG/NAME), or set HF_HUB_CACHE / HF_HOME")
    return [str(root)]


def _ray_executor(address):
    """Imported only for --executor ray: the light install has no ray."""
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.batch.ray_executor import RayExecutor

    return RayExecutor(address=address)


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--profile", default="auto", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def inspect(path, profile, as_json):
    """Summarise a package: profile, files, quantization, options, buckets, limits."""
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.core.textsafe import safe_tree
    from raipack.summary import render, summary  # late: as above

    data = summary(path, profile)
    if as_json:
        click.echo(json.dumps(safe_tree(data), indent=2))
    else:
        render(safe_tree(data, markup=True))
