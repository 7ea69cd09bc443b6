"""The quantize stage's memory estimate: sizes of real models, the refusal, and the estimate against a measured run."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raipack.core.errors import RaipackError, UsageError
from raipack.stages.quantize import memory
from raipack.stages.quantize.memory import GIB, Estimate, available, check, estimate, parse_size

SEEDS = json.loads((Path(__file__).resolve().parents[1] / "data" / "seeds.json").read_text())["families"]
REPO = Path(__file__).resolve().parents[2]

SMOLLM2 = {  # SmolLM2-135M(-Instruct) config.json, the sizes that matter
    "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
    "tie_word_embeddings": True, "dtype": "float32",
}
DEFAULT = {"device": "cpu", "num_samples": 4, "seq_len": 256, "algorithm": "awq"}


def est(cfg: dict, dtype: str = "float32", **kw) -> Estimate:
    return estimate(cfg, dtype=dtype, **{**DEFAULT, **kw})


# ----------------------------------------------------------------- parameter counts and sizes


@pytest.mark.parametrize(
    "name, params",
    [("llama-3.1-8b", 8.030e9), ("llama-3.2-3b", 3.213e9), ("phi-3.5-mini", 3.821e9)],
)
def test_parameter_count_of_seed_models(name, params):
    e = est(SEEDS[name]["config"])
    assert e.params == pytest.approx(params, rel=0.002)
    assert e.weights == 4 * e.params
    assert est(SEEDS[name]["config"], "bfloat16").weights == 2 * e.params


def test_smollm2_parameter_count_and_tied_head():
    e = est(SMOLLM2)
    assert e.params == pytest.approx(134.5e6, rel=0.002)
    untied = est(dict(SMOLLM2, tie_word_embeddings=False))
    assert untied.params - e.params == 49152 * 576  # the lm_head


def test_llama_8b_weights_in_gib():
    cfg = SEEDS["llama-3.1-8b"]["config"]
    assert est(cfg).weights / GIB == pytest.approx(29.9, abs=0.1)
    assert est(cfg, "bfloat16").weights / GIB == pytest.approx(15.0, abs=0.1)


def test_fused_phi3_has_the_same_count_as_split_projections():
    phi = SEEDS["phi-3.5-mini"]["config"]
    as_llama = dict(phi, model_type="llama")
    assert est(phi).params == est(as_llama).params
    # but Quark caches one input per linear: the fused form caches fewer copies of the hidden state
    assert est(phi).terms["linear_inputs"] < est(as_llama).terms["linear_inputs"]


def test_qwen2_counts_qkv_bias():
    cfg = dict(SEEDS["llama-3.2-3b"]["config"], model_type="qwen2")
    extra = est(cfg).params - est(SEEDS["llama-3.2-3b"]["config"]).params
    assert extra == 28 * (24 + 2 * 8) * 128


def test_activations_grow_with_calibration_and_rtn_has_none():
    cfg = SEEDS["llama-3.2-3b"]["config"]
    small, big = est(cfg, "bfloat16", num_samples=1, seq_len=128), est(cfg, "bfloat16", num_samples=16, seq_len=1024)
    assert small.activations < big.activations
    assert big.terms["layer_forward"] > 16 * 24 * 1024 * 1024 * 2  # eager attention scores of one layer
    rtn = est(cfg, "bfloat16", algorithm="rtn")
    assert set(rtn.terms) == {"layer_weights"} and rtn.activations < small.activations
    gptq = est(cfg, "bfloat16", algorithm="gptq")
    assert gptq.terms["hessians"] == (6 * 3072**2 + 8192**2) * 4  # q k v o gate up read 3072, down 8192


def test_clip_search_term_follows_quark():
    # down_proj of SmolLM2: out 576 (not a multiple of 256: batches of 64), in 1536; gate/up: 256 x 576
    # raipack splits the search to keep the product within 256 MiB (awq_clip.py): gate/up get 227 of Quark's 256 rows
    e = est(SMOLLM2, num_samples=4, seq_len=256)  # 1024 tokens, sampled every 2nd: 512
    assert e.terms["clip_search"] == 227 * 512 * 576 * 4 <= 256 << 20
    odd = est(SMOLLM2, num_samples=3, seq_len=300)  # 900 tokens: stride 1, all 900
    assert odd.terms["clip_search"] == 129 * 900 * 576 * 4
    few = est(SMOLLM2, num_samples=1, seq_len=128)  # 128 tokens: Quark's own batch fits the bound
    assert few.terms["clip_search"] == 256 * 128 * 576 * 4


def test_loading_counts_a_dtype_conversion_only():
    cfg = SEEDS["llama-3.1-8b"]["config"]  # torch_dtype bfloat16
    assert est(cfg, "bfloat16").loading == 0
    assert est(cfg, "float32").loading > est(cfg, "float32").weights / 2


def test_totals_and_lines():
    e = est(SEEDS["llama-3.1-8b"]["config"], "bfloat16")
    b = e.breakdown()
    assert set(b) == {"weights", "activations", "export", "quantized_copy", "loading", "overhead", "total"}
    assert b["total"] > b["weights"] + b["overhead"]
    # the weights (15 GiB) once: the stage owns them before AWQ writes into them (no copy-on-write copies, issue 25),
    # then the larger of the calibration work (its searches, times the factor) and the export
    assert e.quantized_copy == 0
    assert e.total == e.weights + max(math.ceil(e.safety_factor * e.activations), e.export) + e.overhead
    # the searches never run at the same time: the larger counts, not their sum
    t = e.terms
    assert e.activations == sum(t.values()) - t["clip_search"] - t["scale_search"] - t["layer_forward"] + max(t["clip_search"], t["scale_search"], t["layer_forward"])
    assert t["scale_search"] == 6 * 4 * 2 * 4096 * 14336  # 6 float32 copies of gate_proj + up_proj, the largest scaling group
    assert 20 * GIB < e.total < 23 * GIB
    rtn = est(SEEDS["llama-3.1-8b"]["config"], "bfloat16", algorithm="rtn")
    assert rtn.quantized_copy == 0  # RTN holds no copy since the stage skips freeze() (issue 25)
    assert 19 * GIB < rtn.total < 23 * GIB
    text = "\n".join(e.lines())
    assert "8.030B parameters" in text and "weights      15.0 GiB" in text and "clip_search" in text and "scale_search" in text


def test_constants_come_from_the_data_file():
    data = memory.model_data()
    assert data["bytes_per_dtype"] == {"float32": 4, "bfloat16": 2, "float16": 2}
    assert est(SMOLLM2).overhead == data["overhead_mib"]["cpu"] * 2**20
    assert est(SMOLLM2).safety_factor == data["safety_factor"]["value"]


# ----------------------------------------------------------------- available memory


def test_parse_size():
    assert parse_size("1024") == 1024
    assert parse_size("8GiB") == 8 * GIB
    assert parse_size("1.5 G") == int(1.5 * GIB)
    assert parse_size("2GB") == 2 * 10**9
    with pytest.raises(UsageError, match="RAIPACK_MEMORY_LIMIT='lots' is not a size"):
        parse_size("lots")


def test_available_reads_meminfo_or_the_override(monkeypatch):
    monkeypatch.delenv("RAIPACK_MEMORY_LIMIT", raising=False)
    avail, source = available("cpu")
    assert source == "MemAvailable" and 0 < avail < 2**50
    monkeypatch.setenv("RAIPACK_MEMORY_LIMIT", "3GiB")
    assert available("cpu") == (3 * GIB, "RAIPACK_MEMORY_LIMIT")


def _model_dir(tmp_path: Path, cfg: dict) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_check_refuses_with_numbers_and_a_calibration_that_fits(tmp_path, monkeypatch):
    cfg = SEEDS["llama-3.2-3b"]["config"]
    d = _model_dir(tmp_path, cfg)
    asked = est(cfg, "bfloat16", num_samples=32, seq_len=2048)
    smallest = est(cfg, "bfloat16", num_samples=1, seq_len=16)
    assert asked.total > smallest.total + GIB  # 32 x 2048 tokens: attention scores and clipping search
    limit = (asked.total + smallest.total) // 2
    monkeypatch.setenv("RAIPACK_MEMORY_LIMIT", str(limit))
    with pytest.raises(RaipackError) as err:
        check(d, dtype="bfloat16", device="cpu", num_samples=32, seq_len=2048, algorithm="awq")
    msg, hint = str(err.value), err.value.hint
    assert str(d) in msg and f"needs about {memory.gib(asked.total)}" in msg and "weights 5.98 GiB in bfloat16" in msg
    assert "32 x 2048 tokens" in msg and f"only {memory.gib(limit)} is available on cpu (RAIPACK_MEMORY_LIMIT)" in msg
    assert 'device = "cuda"' in hint and "--num-samples" in hint and "--seq-len" in hint
    n = int(hint.split("--num-samples ")[1].split()[0])
    m = int(hint.split("--seq-len ")[1].split()[0])
    assert n * m < 32 * 2048
    suggested = est(cfg, "bfloat16", num_samples=n, seq_len=m)
    assert suggested.total <= limit and f"would need {memory.gib(suggested.total)}" in hint


def test_check_when_even_the_weights_do_not_fit(tmp_path, monkeypatch):
    cfg = SEEDS["llama-3.1-8b"]["config"]
    d = _model_dir(tmp_path, cfg)
    monkeypatch.setenv("RAIPACK_MEMORY_LIMIT", "16GiB")  # in bfloat16 the 8B needs ~21 GiB (issue 25), in float32 ~48
    with pytest.raises(RaipackError) as err:
        check(d, dtype="float32", device="cpu", num_samples=4, seq_len=256, algorithm="awq")
    assert "weights 29.9 GiB in float32" in str(err.value)
    assert "even the weights" in err.value.hint and "bfloat16" not in err.value.hint  # bf16 does not fit either
    assert f"at least {memory.gib(est(cfg).total)} free" in err.value.hint


def test_check_suggests_bfloat16_when_it_fits(tmp_path, monkeypatch):
    cfg = SEEDS["llama-3.2-3b"]["config"]  # a bfloat16 checkpoint: float32 converts while loading
    d = _model_dir(tmp_path, cfg)
    limit = est(cfg, "bfloat16").total + GIB
    assert est(cfg, "float32", num_samples=1, seq_len=16).total > limit
    monkeypatch.setenv("RAIPACK_MEMORY_LIMIT", str(limit))
    with pytest.raises(RaipackError) as err:
        check(d, dtype="float32", device="cpu", num_samples=4, seq_len=256, algorithm="awq")
    assert 'dtype = "bfloat16" with --num-samples 4 --seq-len 256 would need' in err.value.hint


def test_check_records_the_estimate_when_it_fits(tmp_path, monkeypatch):
    d = _model_dir(tmp_path, SMOLLM2)
    monkeypatch.setenv("RAIPACK_MEMORY_LIMIT", "24GiB")
    rec = check(d, dtype="float32", device="cpu", num_samples=4, seq_len=256, algorithm="awq")
    assert rec["estimate_bytes"] == rec["breakdown"]["total"] == est(SMOLLM2).total
    assert rec["available_bytes"] == 24 * GIB
    # a folder without a usable config.json is left to the stage's own checks
    assert check(tmp_path, dtype="float32", device="cpu", num_samples=4, seq_len=256, algorithm="awq")["estimate_bytes"] is None


# ----------------------------------------------------------------- the stage through the CLI


def _build(model: Path, tmp_path: Path, limit: str | None, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAIPACK_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1")
    env.pop("RAIPACK_MEMORY_LIMIT", None)
    if limit:
        env["RAIPACK_MEMORY_LIMIT"] = limit
    cmd = [sys.executable, "-m", "raipack.cli", "build", str(model), "--until", "quantize", "-o", str(tmp_path / "out"), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=900)


def test_cli_refuses_when_memory_is_short(tiny_llama, tmp_path):
    proc = _build(tiny_llama, tmp_path, "300MiB")
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr
    assert str(tiny_llama) in errors[0] and "GiB" in errors[0] and "0.29 GiB is available" in errors[0]
    assert "hint:" in proc.stderr and 'device = "cuda"' in proc.stderr
    # nothing of the quantize stage is left: no cache entry, no staging folder, no link in the output
    quantize_cache = tmp_path / "cache" / "stages" / "quantize"
    assert not quantize_cache.exists() or list(quantize_cache.iterdir()) == []
    assert [p for p in (tmp_path / "out").rglob("*")] == []


def test_cli_records_estimate_next_to_measured_peak(tiny_llama, tmp_path):
    # The estimate models an import of Quark whose C++ extension is built; the first import on a new
    # machine compiles it inside the call and peaks higher (+0.25 GiB here, +0.64 GiB once in a
    # clean-clone CI run; docs/memory.md), so the extension is built before the measured build.
    from raipack.stages.quark_import import import_quark

    import_quark(say=None)
    proc = _build(tiny_llama, tmp_path, None, "--num-samples", "4", "--seq-len", "256")
    assert proc.returncode == 0, proc.stderr
    [entry] = list((tmp_path / "cache" / "stages" / "quantize").iterdir())
    report = json.loads((entry / "manifest.json").read_text())["report"]
    mem, peak = report["memory"], report["peak_rss_bytes"]
    assert mem["available_source"] == "MemAvailable" and mem["available_bytes"] > 0
    assert mem["estimate_bytes"] == mem["breakdown"]["total"]
    # measured: the estimate is within issue 25's 1.5x of the peak of quantize() (imports, load, AWQ,
    # export); it covered it here (0.95 GiB peak, 1.37 estimated), but two clean-clone CI runs measured
    # 1.59 GiB for this build, cause not found (docs/memory.md, "Known gap") ...
    assert 1.5 * mem["estimate_bytes"] >= peak, (mem, peak)
    # ... and its model-dependent part (dominated by the clipping search here) is not a wild overestimate
    modelled = mem["estimate_bytes"] - mem["breakdown"]["overhead"]
    assert modelled >= mem["activation_terms"]["clip_search"] > 200 * 2**20
    assert mem["estimate_bytes"] < peak + 0.6 * GIB, (mem, peak)  # a tiny model is mostly runtime: the slack is absolute
