"""Quantize and export stages against bare tool calls on the example model, AWQ
against round-to-nearest, and a cache-hit rebuild (issues 3, 4, 6), side by side.

The stage side is `raipack build --until quantize` (quality measurement off, a
2x128-token calibration to keep the bench short); the bare side is a script
making the same Quark calls with the same calibration tokens and the same
process settings (allocator, threads).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PY = sys.executable
RAIPACK = str(Path(PY).with_name("raipack"))
SAMPLES, SEQ = 2, 128

BARE_QUARK = r"""
import sys, time, resource
from pathlib import Path
sys.path.insert(0, sys.argv[4])
# The same process settings the stage uses (allocator thresholds, threads): without them the bare
# script is several times slower (docs/measurements/quantize.md), and the ratio is meant to show the
# stage's own overhead, not the settings' gain.
from raipack.stages.quantize.runtime import apply_runtime_settings
apply_runtime_settings()
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from quark.torch import LLMTemplate, ModelQuantizer, export_safetensors
src, out, algo = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, sys.argv[4])
from raipack.stages.quantize.calibration import DEFAULT_CALIBRATION, read_texts, tokenize_texts
tok = AutoTokenizer.from_pretrained(src)
model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
cfg = LLMTemplate.get("llama").get_config(scheme="uint4_wo_64", algorithm=None if algo == "rtn" else algo, kv_cache_scheme=None, exclude_layers=["lm_head"])
batches = tokenize_texts(read_texts(DEFAULT_CALIBRATION), tok, SAMPLES, SEQ, source="calib")
with torch.no_grad():
    q = ModelQuantizer(cfg)
    model = q.quantize_model(model, batches)
    model = q.freeze(model)
export_safetensors(model, out, custom_mode="quark", weight_format="real_quantized", pack_method="reorder")
""".replace("SAMPLES", str(SAMPLES)).replace("SEQ", str(SEQ))

BARE_EXPORT = r"""
import sys, time
from onnxruntime_genai.models.builder import create_model, parse_extra_options
src, out, cache = sys.argv[1], sys.argv[2], sys.argv[3]
opts = ["nodes_to_exclude=/lm_head/MatMul,/model/embed_tokens/Gather", "accuracy_level=1"]
extra = parse_extra_options(None, src, out, "int4", "cpu", cache, opts)
t = time.perf_counter()
create_model(None, src, out, "int4", "cpu", cache, **extra)
print(time.perf_counter() - t)
"""

STAGE_EXPORT = r"""
import sys, time
import onnxruntime_genai.models.builder  # imported before the clock starts, as on the bare side
from raipack.stages.export.builder import export
t = time.perf_counter()
export(sys.argv[1], sys.argv[2])
print(time.perf_counter() - t)
"""


def timed(cmd, env=None) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of a child process."""
    code = ("import resource, subprocess, sys, time; t = time.perf_counter(); r = subprocess.run(sys.argv[1:]);"
            "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode)")
    out = subprocess.run([PY, "-c", code, *cmd], capture_output=True, text=True, env=env).stdout.split()
    if out[-1] != "0":
        raise RuntimeError(f"{cmd[:3]} failed")
    return float(out[-3]), int(out[-2]) / 1024


def ppl(folder: Path) -> float:
    code = ("import sys; from raipack.stages.quantize.quality import load_hf, perplexity; from raipack.data import heldout_text;"
            "m, t = load_hf(sys.argv[1]); print(perplexity(m, t, heldout_text()))")
    return float(subprocess.run([PY, "-c", code, str(folder)], capture_output=True, text=True, check=True).stdout.split()[-1])


def rows(tmp: Path) -> list[dict]:
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, RAIPACK_CACHE=str(tmp / "cache"), PYTHONPATH=str(root))
    recipe = tmp / "r.toml"
    recipe.write_text(f"[quantize]\nnum_samples = {SAMPLES}\nseq_len = {SEQ}\nquality = false\n")
    build = [RAIPACK, "build", "--recipe", str(recipe), "--output", str(tmp / "build"), "--quiet"]
    subprocess.run(build + ["--until", "source"], env=env, check=True, capture_output=True)
    src = next((tmp / "build").glob("*.stages")) / "source"
    t_stage, rss_stage = timed(build + ["--until", "quantize"], env)
    t_bare, rss_bare = timed([PY, "-c", BARE_QUARK, str(src), str(tmp / "bare_awq"), "awq", str(root)], env)
    t_hit, _ = timed(build + ["--until", "quantize"], env)
    awq = (next((tmp / "build").glob("*.stages")) / "quantize").resolve()
    subprocess.run([PY, "-c", BARE_QUARK, str(src), str(tmp / "rtn"), "rtn", str(root)], env=env, check=True, capture_output=True)
    p_src, p_awq, p_rtn = ppl(src), ppl(awq), ppl(tmp / "rtn")
    e_bare, e_stage = [], []
    for i in range(2):
        e_bare.append(float(subprocess.run([PY, "-c", BARE_EXPORT, str(awq), str(tmp / f"eb{i}"), str(tmp / "hf")], env=env, capture_output=True, text=True, check=True).stdout.split()[-1]))
        e_stage.append(float(subprocess.run([PY, "-c", STAGE_EXPORT, str(awq), str(tmp / f"es{i}")], env=env, capture_output=True, text=True, check=True).stdout.split()[-1]))
    eb, es = min(e_bare), min(e_stage)
    note = f"SmolLM2-135M, AWQ {SAMPLES}x{SEQ} tokens, group 64"
    return [
        {"name": "quantize stage wall (build --until quantize)", "value": f"{t_stage:.0f} s", "ratio": t_stage / t_bare, "baseline": f"bare Quark script {t_bare:.0f} s", "goal": "<= 1.05x", "ok": t_stage / t_bare <= 1.05, "note": note},
        {"name": "quantize stage peak RSS", "value": f"{rss_stage:.0f} MiB", "ratio": rss_stage / rss_bare, "baseline": f"bare Quark script {rss_bare:.0f} MiB", "goal": "<= 1.2x", "ok": rss_stage / rss_bare <= 1.2, "note": ""},
        {"name": "AWQ vs RTN held-out perplexity", "value": f"{p_awq:.2f}", "ratio": (p_awq - p_src) / (p_rtn - p_src), "baseline": f"RTN {p_rtn:.2f} (source {p_src:.2f})", "goal": "AWQ loses less (< 1x)", "ok": p_awq < p_rtn, "note": "ratio of the perplexity increases"},
        {"name": "cache-hit rebuild --until quantize", "value": f"{t_hit:.2f} s", "ratio": None, "baseline": "", "goal": "< 3 s", "ok": t_hit < 3, "note": "whole process"},
        {"name": "export stage vs bare create_model", "value": f"{es:.1f} s", "ratio": es / eb, "baseline": f"create_model {eb:.1f} s", "goal": "<= 1.05x", "ok": es / eb <= 1.05, "note": "best of 2, builder import excluded on both sides"},
    ]
