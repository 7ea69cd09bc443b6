"""`raipack eval`: lm-eval-harness on a package, an export, a Quark folder, a source model, or a whole build."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from raipack.cli.main import cli


@cli.command("eval")
@click.argument("target", type=click.Path(path_type=Path))
@click.option("--tasks", "-t", required=True, help="lm-eval task names, comma-separated (its registry, or --include-path).")
@click.option("--limit", type=int, help="At most this many documents per task.")
@click.option("--num-fewshot", type=click.IntRange(0, 1000), help="Few-shot examples per document (default: the task's).")
@click.option("--include-path", type=click.Path(path_type=Path), help="A local task folder: lm-eval YAML task files and their JSONL data.")
@click.option("--chain", is_flag=True, help="TARGET is a build (its output folder or its package): run every stage and show the drops.")
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write lm-eval's results (JSON, with a \"raipack\" key) here.")
@click.option("--numerics", type=click.Choice(["float", "bfp16"]), default=None,
              help="bfp16: score a package under float and under the NPU's BFP16 activations (as Quark defines them), side by side; float: float only. "
                   "Default: the device's, bfp16 for a package of an NPU or hybrid target (raipack's reference packages included), float for other targets.")
def eval_cmd(target, tasks, chain, output, **request):
    """Score TARGET with lm-eval-harness; the kind of TARGET is detected.

    \b
    package  the NPU through onnxruntime-genai when present, else the
             reference runtime on the CPU (the output says which ran)
    export   an onnxruntime-genai builder folder, on onnxruntime
    quark    a Quark export, reloaded by transformers
    source   a Hugging Face model folder, by transformers (no remote code)

    \b
    Exit codes:
      0  evaluated
      1  a target cannot be run
      2  usage error: an unknown task, a task file that is not lm-eval's
         format, a TARGET that is none of the kinds, a bad option,
         --numerics bfp16 on a target that is not a package or without
         amd-quark; nothing is written
    """
    # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
    from raipack.core.output import atomic_write_text
    from raipack.evaluation.run import Request, check_output, evaluate, numerics_table, parse_tasks, table  # late: as above

    req = Request(parse_tasks(tasks), request["limit"], request["num_fewshot"], request["include_path"], request["numerics"])
    check_output(output)
    if chain:
        # late: start-up time — raipack --help imports every command module; a command loads its use case when it runs
        from raipack.evaluation.chain import chain_table, run_chain, stage_outputs

        doc = run_chain(stage_outputs(target), req)
        text = chain_table(doc)
    else:
        doc = evaluate(target, req)
        if "rows" not in doc["raipack"]:  # one numerics: float
            text = table(doc) + f"\nran on: {doc['raipack']['ran_on']}" + (f"\nnote: {doc['raipack']['numerics_skipped']}" if doc["raipack"].get("numerics_skipped") else "")
        else:
            text = numerics_table(doc) + "".join(f"\nran on ({r['numerics']}): {r['ran_on']}" for r in doc["raipack"]["rows"])
    if output is not None:
        atomic_write_text(output, json.dumps(doc, indent=2) + "\n")
    click.echo(text)
    sys.exit(0)
