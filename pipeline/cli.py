"""Command line: parses arguments, calls the logic, turns errors into one line.

Exit codes: 0 clean, 1 error-level findings (or a failed build), 2 usage
error, 3 nothing to validate.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from . import __version__
from .errors import NothingToValidate, RaipackError, UsageError
from .output import atomic_write_text, use_color


def _ids(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="raipack")
def cli():
    """Build and check model packages for AMD Ryzen AI NPUs."""


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--profile", default="auto", show_default=True, help="Profile id (see `raipack profiles`), or auto to detect it.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "junit", "sarif"]), default="text", show_default=True)
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write the report here (atomically); the text summary still goes to stdout.")
@click.option("--strict", is_flag=True, help="Warnings fail the run too.")
@click.option("--strict-advice", is_flag=True, help="Advice fails the run too.")
@click.option("--select", help="Only these check ids or prefixes, comma-separated (RP1,RP202).")
@click.option("--ignore", help="Skip these check ids or prefixes, comma-separated.")
@click.option("--verify-hashes", is_flag=True, help="Hash every file against manifest.json or its Git LFS oid.")
@click.option("--jobs", "-j", type=click.IntRange(1, 256), help="Threads for --verify-hashes (default: every core).")
def validate(paths, profile, fmt, output, strict, strict_advice, select, ignore, verify_hashes, jobs):
    """Check model package folders against their profile's schemas and rules."""
    from .reporters import REPORTERS
    from .validate import validate as run

    results, codes = [], []
    for path in paths:
        try:
            result = run(path, profile, _ids(select), _ids(ignore), verify_hashes, jobs)
        except NothingToValidate as exc:
            _error(exc)
            codes.append(exc.exit_code)
            continue
        results.append(result)
        codes.append(1 if result.failed(strict, strict_advice) else 0)
    code = 1 if 1 in codes else 3 if 3 in codes else 0
    report = REPORTERS[fmt](results, code, use_color(sys.stdout) if fmt == "text" and not output else False)
    if output:
        atomic_write_text(output, report)
        if fmt != "text":
            click.echo(REPORTERS["text"](results, code, use_color(sys.stdout)), nl=False)
    else:
        click.echo(report, nl=False)
    sys.exit(code)


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--profile", default="auto", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def inspect(path, profile, as_json):
    """Summarise a package: profile, files, quantization, options, buckets, limits."""
    from .inspect import render, summary
    from .textsafe import safe_tree

    data = summary(path, profile)
    if as_json:
        click.echo(json.dumps(safe_tree(data), indent=2))
    else:
        render(safe_tree(data, markup=True))


@cli.command()
@click.argument("name", required=False)
def schemas(name):
    """List the JSON Schemas, or print one."""
    from . import schemas as s

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
    from .checks import load_all

    specs = [s for s in load_all().values() if not ids or any(s.id.startswith(i) or s.name == i for i in ids)]
    if ids and not specs:
        raise UsageError(f"no check matches {' '.join(ids)}", "run `raipack checks` to list them")
    for spec in specs:
        click.echo(f"{spec.id} {spec.name} [{spec.severity}]{' (with --' + spec.needs.replace('_', '-') + ')' if spec.needs else ''}")
        for line in spec.doc.splitlines():
            click.echo(f"    {line}")


@cli.command()
@click.argument("profile_id", required=False)
def profiles(profile_id):
    """List the profiles (package generations), or print one."""
    from . import profile as p

    if profile_id:
        click.echo(json.dumps(p.get(profile_id), indent=2))
        return
    for prof in p.all_profiles().values():
        click.echo(f"{prof['id']:16} {prof['title']}")


@cli.command()
@click.argument("model_dir", required=False)
@click.option("--recipe", type=click.Path(path_type=Path), help="A TOML recipe (see `raipack schemas recipe`); flags override it.")
@click.option("--profile", help="Target profile, e.g. 1.8.0-npu-16K (default) or 1.8.0-npu-4K.")
@click.option("--name", help="Model name in the package folder name.")
@click.option("--output", "-o", help="Folder that receives the package (default: build).")
@click.option("--until", help="Stop after this stage (source, quantize, export, fuse, smoke).")
@click.option("--from", "from_", help="Rebuild from this stage on; earlier stages come from the cache.")
@click.option("--force", is_flag=True, help="Rebuild every stage, ignoring the cache.")
@click.option("--verify-cache", is_flag=True, help="Hash every cached output against its manifest before using it (else only when its files' stat changed).")
@click.option("--algorithm", type=click.Choice(["awq", "gptq", "rtn"]), help="Quantization algorithm (default awq).")
@click.option("--group-size", help="Quantization group size: 128, 64, 32 or auto.")
@click.option("--num-samples", type=int, help="Calibration samples.")
@click.option("--seq-len", type=int, help="Calibration sequence length.")
@click.option("--calib-data", help="Calibration text (.txt) or JSON lines (.jsonl, {\"text\": ...}).")
@click.option("--backend", type=click.Choice(["auto", "reference", "ryzenai-sdk"]), help="Fuse backend.")
@click.option("--require-npu", is_flag=True, default=None, help="Fail the smoke stage instead of falling back to the CPU reference runtime.")
@click.option("--trust-remote-code", is_flag=True, default=None, help="Allow a model that needs its own Python code.")
@click.option("--quiet", "-q", is_flag=True, help="Only errors and the final summary.")
@click.option("--json-log", is_flag=True, help="Progress as JSON lines on stderr (for CI).")
def build(model_dir, recipe, profile, name, output, until, from_, force, verify_cache, algorithm, group_size, num_samples, seq_len, calib_data, backend, require_npu, trust_remote_code, quiet, json_log):
    """Build a Ryzen AI NPU package (default: the example model, SmolLM2-135M-Instruct)."""
    from .build_cli import run_build

    if group_size is not None and group_size != "auto":
        if not group_size.isdigit():
            raise UsageError(f"--group-size {group_size!r} is not a number or auto", "use 128, 64, 32 or auto")
        group_size = int(group_size)
    overrides = {"model": model_dir, "profile": profile, "name": name, "output": output, "trust_remote_code": trust_remote_code,
                 "quantize.algorithm": algorithm, "quantize.group_size": group_size, "quantize.num_samples": num_samples,
                 "quantize.seq_len": seq_len, "quantize.calib_data": calib_data, "fuse.backend": backend, "smoke.require_npu": require_npu}
    mode = "json" if json_log else "quiet" if quiet else "auto"
    sys.exit(run_build(recipe, overrides, until=until, from_=from_, force=force, mode=mode, verify_cache=verify_cache))


@cli.command("run")
@click.argument("package", type=click.Path(path_type=Path))
@click.option("--prompt", "-p", required=True, help="The user message.")
@click.option("--max-new-tokens", "-n", type=click.IntRange(1, 100000), default=64, show_default=True)
@click.option("--raw", is_flag=True, help="Do not apply the chat template.")
@click.option("--threads", type=click.IntRange(1, 256), help="CPU threads (default: onnxruntime's choice).")
@click.option("--sdk-version", help="Ryzen AI version whose max_prompt_length applies (default: the package's release).")
def run_cmd(package, prompt, max_new_tokens, raw, threads, sdk_version):
    """Answer a prompt with a raipack package on the CPU reference runtime.

    Before loading, every weights file is checked against the sizes and hashes
    manifest.json records; no file outside the package, and no FIFO or device,
    is opened.

    \b
    Exit codes:
      0  answered
      1  the package cannot be run: a file is missing, corrupt, changed since
         the build or outside the package, or the prompt is longer than the
         package takes
      2  usage error: PACKAGE is not a folder, the prompt is not UTF-8 text,
         a bad option
    """
    from .run_cli import run_prompt

    sys.exit(run_prompt(package, prompt, max_new_tokens, raw, threads, sdk_version))


@cli.command()
@click.argument("package", type=click.Path(path_type=Path))
@click.option("--max-length", type=click.IntRange(1, 1 << 20), help="New search.max_length (prompt + answer tokens).")
@click.option("--max-prompt", type=click.IntRange(1, 1 << 20), help="Longest prompt to serve; checked against the Ryzen AI version's max_prompt_length.")
@click.option("--chunk-size", type=click.IntRange(1, 1 << 20), help="New search.chunk_size; must be a prefill tier of the package.")
@click.option("--sdk-version", help="Ryzen AI version the package runs on (default: $RAIPACK_SDK_VERSION, the installed one, else the package's release).")
@click.option("--profile", default="auto", show_default=True)
@click.option("--dry-run", is_flag=True, help="Show the diff; write nothing.")
def tune(package, max_length, max_prompt, chunk_size, sdk_version, profile, dry_run):
    """Change a package's length settings in genai_config.json, consistently and safely."""
    from .reporters import REPORTERS
    from .tune import apply, plan, revalidate

    p = plan(package, max_length, max_prompt, chunk_size, sdk_version, profile)
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
    click.echo(REPORTERS["text"]([result], code, use_color(sys.stdout)), nl=False)
    sys.exit(code)


@cli.group()
def cache():
    """The stage cache ($RAIPACK_CACHE, else the platform's cache folder)."""


@cache.command("ls")
def cache_ls():
    """List cached stage outputs."""
    from . import cache as c

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
    from . import cache as c

    if stale:
        if stage:
            raise UsageError("cache clear --stale takes no STAGE: it sweeps the whole cache", "run `raipack cache clear --stale`, or `raipack cache clear STAGE` to remove that stage's outputs")
        from .staging import sweep_cache

        gone = sweep_cache(c.cache_root())
        click.echo(f"removed {len(gone)} staging folder{'s' if len(gone) != 1 else ''} of killed builds from {c.cache_root()}")
        return
    n = c.clear(stage)
    click.echo(f"removed {n} cached output{'s' if n != 1 else ''} from {c.cache_root()}")


def _error(exc: RaipackError):
    from .textsafe import safe

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
        _error(exc)
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    sys.exit(0)


if __name__ == "__main__":
    main()
