"""Each outside tool run alone on the same input as its stage (issue 41): Quark quantizing the
real-size model `bench/real_size.py --keep DIR` wrote, and onnxruntime-genai's model builder exporting
the quantize stage's output, each in a process of its own with the page cache dropped first (cold, as
the stage rows are). Their wall time, CPU time, peak RSS (VmHWM) and peak RssAnon go into the same
result file as the stage rows (bench/out/real_size_<model>.json, key "tool_alone"), and `real_size.py
--table` shows them beside each stage's own peak: a stage over 14 GiB must stay within 1 GiB of its
tool alone.

The tool's calls are the ones the stage makes, nothing of raipack's around them:
- quantize: transformers' `from_pretrained` (bfloat16, the file mapped as transformers maps it), Quark's
  LLMTemplate config (uint4_wo_128, lm_head excluded, no KV-cache scheme; AWQ with Quark's own llama
  groups), `ModelQuantizer.quantize_model` on the same calibration tokens (1 x 16 from raipack's corpus,
  AWQ only), `export_safetensors(..., pack_method="reorder")`. The process settings are the stage's
  (`apply_runtime_settings`: threads, allocator thresholds, flush-denormal): without them Quark's CPU path
  is several times slower (docs/measurements/quantize.md), so the tool measured is the tool as the stage
  runs it. No `freeze()` (the stage does not call it: stages/quantize/quark_awq.py).
- export: `parse_extra_options` + `create_model(None, QUARK_DIR, OUT, "int4", "cpu", CACHE, ...)` with the
  stage's options (`nodes_to_exclude` of the excluded lm_head and the embedding's Gather, accuracy_level),
  without raipack's patches or skipped passes.

    python bench/tool_alone.py --model llama-3.1-8b --keep /tmp/real8 --tools quark,builder --algorithms rtn,awq
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import page_cache  # noqa: E402  (bench/, on the path just above)
import real_size  # noqa: E402

QUARK = r"""
import json, sys, time
src, out, algo, samples, seq_len = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
from raipack.stages.quantize.runtime import apply_runtime_settings
apply_runtime_settings()
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from quark.torch import LLMTemplate, ModelQuantizer, export_safetensors
t = {}
t0 = time.perf_counter()
batches = None
if algo != "rtn":
    from raipack.stages.quantize.calibration import DEFAULT_CALIBRATION, read_texts, tokenize_texts
    tok = AutoTokenizer.from_pretrained(src)
    batches = tokenize_texts(read_texts(DEFAULT_CALIBRATION), tok, samples, seq_len, source="calib")
model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16, use_safetensors=True).eval()
t["load"] = time.perf_counter() - t0
cfg = LLMTemplate.get("llama").get_config(scheme="uint4_wo_128", algorithm=None if algo == "rtn" else algo, kv_cache_scheme=None, exclude_layers=["lm_head"])
t0 = time.perf_counter()
with torch.no_grad():
    model = ModelQuantizer(cfg).quantize_model(model, batches)
t["quantize"] = time.perf_counter() - t0
t0 = time.perf_counter()
export_safetensors(model, out, custom_mode="quark", weight_format="real_quantized", pack_method="reorder")
t["export"] = time.perf_counter() - t0
print(json.dumps(t))
"""

BUILDER = r"""
import json, sys, time
from onnxruntime_genai.models.builder import create_model, parse_extra_options
src, out, cache, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
extra = parse_extra_options(None, src, out, "int4", "cpu", cache, [f"{k}={v}" for k, v in options.items()])
t0 = time.perf_counter()
create_model(None, src, out, "int4", "cpu", cache, **extra)
print(json.dumps({"builder": time.perf_counter() - t0}))
"""

# Run a script (argv[2]) in this process, its peak written to argv[1] at exit
CHILD = real_size.PEAK_AT_EXIT + r"""
code = sys.argv.pop(1)
exec(compile(code, "<tool>", "exec"), {"__name__": "__main__"})
"""


def run_tool(code: str, args: list[str], work: Path, sample_s: float = 0.2) -> dict:
    """`code` run with `args` in a child (real_size.measured): wall and CPU seconds, VmHWM, the peak RssAnon sampled, its JSON timings."""
    run = real_size.measured([code, *args], real_size.user_env(dict(os.environ)), work, sample_s, child=CHILD)  # bytecode as a user's
    lines = run["stdout"].strip().splitlines()
    return {"rc": run["rc"], "wall_s": round(run["wall_s"], 1), "cpu_s": round(run["cpu_s"], 1), "peak_rss": run["peak_rss"], "peak_anon": run["peak_anon"],
            "timings": json.loads(lines[-1]) if run["rc"] == 0 and lines else None,
            "error": "" if run["rc"] == 0 else "\n".join(run["stderr"].strip().splitlines()[-6:])}


def stage_dir(work: Path, algorithm: str, stage: str) -> Path:
    """The stage's output in `real_size.py --keep WORK`'s build of `algorithm`."""
    found = sorted((work / f"build-{algorithm}").glob(f"*.stages/{stage}"))
    if not found:
        raise SystemExit(f"{work}/build-{algorithm}: no {stage} stage output; run bench/real_size.py --keep {work} --algorithms {algorithm} --until {stage} first")
    return found[0].resolve()


def measure(tool: str, algorithm: str, work: Path, model: Path, cold: bool) -> dict:
    """One tool alone on its stage's input; its output is written into `work` and removed after."""
    out = work / f"alone-{tool}-{algorithm}"
    shutil.rmtree(out, ignore_errors=True)
    if tool == "quark":
        code, args, inputs = QUARK, [str(model), str(out), algorithm, str(real_size.AWQ_SAMPLES), str(real_size.AWQ_SEQ_LEN)], [model / "model.safetensors"]
    else:
        quark_dir = stage_dir(work, algorithm, "quantize")
        options = json.loads((stage_dir(work, algorithm, "export") / "manifest.json").read_text())["report"]["extra_options"]
        code, args, inputs = BUILDER, [str(quark_dir), str(out), str(out / "cache"), json.dumps(options)], sorted(quark_dir.glob("*.safetensors"))
    cache = page_cache.prepare(cold, inputs)
    row = {"tool": tool, "algorithm": algorithm, **run_tool(code, args, work), **cache}
    shutil.rmtree(out, ignore_errors=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.2-1b", choices=sorted(real_size.MODELS))
    ap.add_argument("--keep", type=Path, required=True, help="the folder of an earlier `bench/real_size.py --keep` run (its model and stage outputs)")
    ap.add_argument("--tools", default="quark,builder", help="comma-separated: quark (the quantize stage's tool), builder (the export stage's)")
    ap.add_argument("--algorithms", default="rtn,awq", help="comma-separated")
    ap.add_argument("--warm", action="store_true", help="keep the page cache (default: dropped first, as root)")
    args = ap.parse_args(argv)
    model = args.keep / f"{args.model}-random"
    if not (model / "model.safetensors").is_file():
        raise SystemExit(f"{model}: no model.safetensors; run bench/real_size.py --model {args.model} --keep {args.keep} first")
    target = HERE / "out" / f"real_size_{args.model}.json"
    result = json.loads(target.read_text()) if target.exists() else {"rows": [], "packages": {}}
    alone = result.setdefault("tool_alone", {})
    real_size.warm_bytecode(real_size.user_env(dict(os.environ)))  # no tool run pays for compiling its sources
    for algorithm in args.algorithms.split(","):
        for tool in args.tools.split(","):
            row = measure(tool, algorithm, args.keep, model, cold=not args.warm)
            row["machine"] = real_size.machine()
            alone[f"{real_size.TOOL_STAGE[tool]}/{algorithm}"] = row
            real_size.save(result, target)
            print(f"{algorithm:4} {tool:8} alone ({row['cache']}): {row['wall_s']} s, CPU {row['cpu_s']} s, peak RSS {real_size._gib(row['peak_rss'])}, "
                  f"RssAnon {real_size._gib(row['peak_anon'])}, exit {row['rc']} {row['timings'] or row['error']}", flush=True)
    return 0 if all(r["rc"] == 0 for r in alone.values()) else 1


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
