"""Every stage's memory estimate through the stage registry, and the runner's refusal on a fake small machine."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import fake_stages
from raipack.builder import stages
from raipack.builder.config import parse_config
from raipack.builder.recipe import load
from raipack.builder.runner import MemoryRefused, build
from raipack.core.memory import GIB
from raipack.core.stage import MemoryEstimate
from raipack.npu import profile as profiles
from raipack.npu.dims import parameter_count

# meta-llama/Llama-3.2-1B's published config.json (the sizes bench/real_size.py builds)
LLAMA_1B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
            "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
            "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
LLAMA_3B = {**LLAMA_1B, "hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 24, "head_dim": 128}
LLAMA_8B = {**LLAMA_1B, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "head_dim": 128, "tie_word_embeddings": False}
# measured peaks (VmHWM) of those models' stages, random weights, issue 25's final code (session 11): bench/real_size.py, docs/measurements/real_size.md
MEASURED = {"llama-3.2-1b": (LLAMA_1B, {"quantize": 3.26 * GIB, "export": 4.62 * GIB, "fuse": 0.85 * GIB, "smoke": 4.49 * GIB}),
            "llama-3.2-3b": (LLAMA_3B, {"quantize": 8.52 * GIB, "export": 9.19 * GIB, "fuse": 1.78 * GIB, "smoke": 10.68 * GIB}),
            "llama-3.1-8b": (LLAMA_8B, {"quantize": 16.49 * GIB, "export": 15.99 * GIB, "fuse": 3.86 * GIB, "smoke": 11.84 * GIB}),
            # AWQ, 1 x 16 calibration tokens
            "llama-3.2-1b-awq": (LLAMA_1B, {"quantize": 3.54 * GIB, "export": 4.04 * GIB, "fuse": 0.85 * GIB, "smoke": 4.43 * GIB}),
            "llama-3.2-3b-awq": (LLAMA_3B, {"quantize": 8.23 * GIB, "export": 9.30 * GIB, "fuse": 1.78 * GIB, "smoke": 10.71 * GIB}),
            "llama-3.1-8b-awq": (LLAMA_8B, {"quantize": 19.13 * GIB, "export": 16.10 * GIB, "fuse": 3.85 * GIB, "smoke": 12.19 * GIB})}


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.delenv("RAIPACK_MEMORY_LIMIT", raising=False)
    return fake_stages.use_in_test(tmp_path, monkeypatch)


def _model(tmp_path: Path, cfg: dict) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_parameter_count_is_the_published_one_and_quantize_agrees():
    from raipack.stages.quantize.memory import Shape

    assert parameter_count(LLAMA_1B) == 1_235_814_400 == Shape.from_config(LLAMA_1B).params()
    with pytest.raises(ValueError, match="hidden_size"):
        parameter_count({"model_type": "llama"})


def test_every_stage_is_estimated_before_it_runs(tmp_path):
    model, profile = _model(tmp_path, LLAMA_1B), profiles.get("1.8.0-npu-16K")
    for name in stages.order():
        st = stages.get(name)
        est = stages.memory(name, parse_config(st.config, None, f"[{name}]"), [model], profile)
        assert est.bytes > 0.5 * GIB and est.basis, (name, est)
        if name == "quantize":  # its own model: the breakdown beside the total
            assert est.details["breakdown"]["total"] == est.bytes and "calibration activations" in est.basis


@pytest.mark.parametrize("model", sorted(MEASURED))
def test_estimates_hold_the_measured_peaks(tmp_path, model):
    """Issue 25: each stage's estimate covers its measured peak and is within 1.5x of it, at 1B, 3B and 8B,
    RTN and AWQ (the peaks of bench/real_size.py's runs)."""
    cfg, peaks = MEASURED[model]
    folder, profile = _model(tmp_path, cfg), profiles.get("1.8.0-npu-16K")
    for name, peak in peaks.items():
        st = stages.get(name)
        options = ({"algorithm": "awq", "num_samples": 1, "seq_len": 16} if model.endswith("-awq") else {"algorithm": "rtn"}) if name == "quantize" else None
        config = parse_config(st.config, options, f"[{name}]")
        est = stages.memory(name, config, [folder], profile).bytes
        assert peak <= est <= 1.5 * peak, (model, name, est / GIB, peak / GIB)
    # before any config.json is known (the example's source stage): the rule's base alone
    assert stages.memory("source", None, [tmp_path / "nothing"], profile).bytes == 1 * GIB


def test_quantize_falls_back_to_the_allowance_for_an_unknown_architecture(tmp_path):
    odd = _model(tmp_path, {"model_type": "mamba", "vocab_size": 10})
    st = stages.get("quantize")
    est = stages.memory("quantize", parse_config(st.config, None, "[quantize]"), [odd], profiles.get("1.8.0-npu-16K"))
    assert "allowance" in est.basis and est.bytes == 1 * GIB


def test_a_refused_stage_leaves_nothing_behind_and_the_flag_runs_it(env, monkeypatch):
    build(load(None, {"output": "build"}), until="source")
    monkeypatch.setenv("RAIPACK_MEMORY_LIMIT", "512MiB")  # a fake small machine
    with pytest.raises(MemoryRefused) as err:
        build(load(None, {"output": "build"}))
    msg, hint = str(err.value), err.value.hint
    assert "stage quantize needs about" in msg and "GiB of memory (raipack's allowance for" in msg
    assert msg.endswith("but only 0.50 GiB is available on cpu (RAIPACK_MEMORY_LIMIT)") and "--ignore-memory" in hint
    assert fake_stages.calls_in(env) == ["source"]  # quantize never ran
    quantize_cache = env / "cache" / "stages" / "quantize"
    assert not quantize_cache.exists() or list(quantize_cache.iterdir()) == []
    assert sorted(p.name for p in (env / "build").iterdir()) == ["SmolLM2-135M-Instruct_rai_1.8.0_npu_16K.stages"]
    assert [p.name for p in (env / "build" / "SmolLM2-135M-Instruct_rai_1.8.0_npu_16K.stages").iterdir()] == ["source"]

    result = build(load(None, {"output": "build"}), ignore_memory=True)
    mem = {s.name: s.report["memory"] for s in result.stages if s.status == "built"}
    assert list(mem) == ["quantize", "export", "fuse", "smoke"]
    for record in mem.values():  # the estimate beside the measured peak, and that the refusal was overridden
        assert record["ignored"] is True and record["estimate_bytes"] > 512 * 2**20 and record["peak_rss_bytes"] > 0
        assert record["available_source"] == "RAIPACK_MEMORY_LIMIT"


def test_a_stage_s_own_estimate_and_hint_reach_the_refusal(env, monkeypatch):
    seen = []

    def own(config, model_config, profile):
        seen.append(model_config is not None and "hidden_size" in model_config)
        return MemoryEstimate(3 * GIB, "weights 3 GiB in float32", hint=lambda avail: f"a smaller calibration would fit in {avail} bytes")

    fakes = dict(fake_stages.FAKES, quantize=dataclasses.replace(fake_stages.FAKES["quantize"], memory=own))
    monkeypatch.setattr("raipack.builder.stages.get", fakes.__getitem__)
    monkeypatch.setenv("RAIPACK_MEMORY_LIMIT", "2GiB")
    with pytest.raises(MemoryRefused) as err:
        build(load(None, {"output": "build"}))
    assert seen == [True]  # it got the source's config.json
    assert "stage quantize needs about 3.00 GiB of memory (weights 3 GiB in float32) but only 2.00 GiB" in str(err.value)
    assert err.value.hint.startswith(f"a smaller calibration would fit in {2 * GIB} bytes")


def test_a_batch_job_asks_its_executor_for_the_registry_s_estimate(tmp_path):
    from raipack.batch.jobs import StageJob
    from raipack.batch.resources import estimate

    model, profile = _model(tmp_path, LLAMA_1B), profiles.get("1.8.0-npu-16K")
    for stage, table in (("quantize", {"algorithm": "rtn"}), ("smoke", {"require_npu": True})):
        recipe = load(None, {"model": str(model), f"{stage}.{next(iter(table))}": next(iter(table.values()))})
        want = stages.memory(stage, parse_config(stages.get(stage).config, recipe.stages.get(stage), f"[{stage}]"), [model], profile)
        asked = estimate(StageJob(stage, "e", recipe))
        assert asked["memory"] == want.bytes > GIB and asked["num_gpus"] == 0
    assert asked["npu"] == 1  # a smoke that requires the NPU still asks for one
    recipe = load(None, {"model": str(model)})
    recipe.stages["quantize"] = {"device": "cuda"}  # estimated on the GPU: one GPU, the host keeps the registry's allowance
    asked = estimate(StageJob("quantize", "e", recipe))
    assert asked["num_gpus"] == 1 and asked["memory"] == stages.allowance("quantize", LLAMA_1B, profile).bytes
