"""Quantize stage building blocks: group-size checks, Quark RTN/AWQ on a tiny Llama, calibration."""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import sys
import types
from pathlib import Path

import pytest

from raipack.core.errors import RaipackError
from raipack.data import HELDOUT_TEXT as HELDOUT
from raipack.stages.quantize.calibration import (
    DEFAULT_CALIBRATION,
    read_texts,
    tokenize_texts,
)
from raipack.stages.quantize.preflight import GroupSizeError, check_group_size, resolve_group_size
from raipack.stages.quantize.quark_awq import quantize
from raipack.stages.quantize.runtime import apply_runtime_settings, quark_compile, runtime_env


def config_of(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


SMOLLM2_SHAPE = {
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "num_hidden_layers": 30,
    "head_dim": 64,
    "vocab_size": 49152,
}


# ----------------------------------------------------------------- group size, from config alone


def test_group_size_offenders_computed_from_config():
    offenders = dict(check_group_size(SMOLLM2_SHAPE, 128, ("lm_head",)))
    # every layer that reads the 576-wide hidden state, in all 30 decoder layers
    assert offenders["model.layers.0.self_attn.q_proj"] == 576
    assert offenders["model.layers.29.mlp.gate_proj"] == 576
    assert offenders["model.layers.7.self_attn.o_proj"] == 576  # 9 heads x 64
    assert not any("down_proj" in name for name in offenders)  # 1536 = 12 x 128
    assert "lm_head" not in offenders  # excluded
    assert len(offenders) == 30 * 6
    assert check_group_size(SMOLLM2_SHAPE, 64, ("lm_head",)) == []


def test_group_size_exclusion_uses_quark_patterns():
    offenders = check_group_size(SMOLLM2_SHAPE, 128, ("lm_head", "*self_attn*", "*gate_proj", "*up_proj"))
    assert offenders == []
    with_head = check_group_size(SMOLLM2_SHAPE, 128, ())
    assert ("lm_head", 576) in with_head


def test_group_size_for_phi3_shape():
    phi3 = {
        "model_type": "phi3",
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "num_hidden_layers": 2,
        "vocab_size": 32064,
    }
    assert check_group_size(phi3, 128, ("lm_head",)) == []
    names = {n for n, _ in check_group_size(phi3, 128, ())}
    assert names == set()  # 3072 = 24 x 128, lm_head too
    odd = dict(phi3, intermediate_size=8200)
    assert dict(check_group_size(odd, 128, ("lm_head",))) == {
        "model.layers.0.mlp.down_proj": 8200,
        "model.layers.1.mlp.down_proj": 8200,
    }


def test_group_size_from_model_dir(tiny_llama):
    assert check_group_size(tiny_llama, 128, ("lm_head",)) == []


def test_auto_group_size_picks_64_for_hidden_576_and_warns():
    chosen, warning = resolve_group_size(SMOLLM2_SHAPE, "auto", ("lm_head",))
    assert chosen == 64
    assert "128" in warning and "q_proj" in warning and "576" in warning
    assert resolve_group_size(dict(SMOLLM2_SHAPE, hidden_size=512, num_attention_heads=8), "auto") == (128, None)


def test_auto_group_size_fails_when_nothing_divides():
    cfg = dict(SMOLLM2_SHAPE, intermediate_size=1000)  # 1000 = 8 x 125
    with pytest.raises(GroupSizeError, match=r"mlp\.down_proj.*1000"):
        resolve_group_size(cfg, "auto")


def test_unsupported_group_size_rejected():
    with pytest.raises(RaipackError, match="group size 96 is not supported"):
        resolve_group_size(SMOLLM2_SHAPE, 96)


def _fake_model_dir(tmp_path: Path, **overrides) -> Path:
    """config.json of a tiny Llama plus *garbage* weights: any attempt to load them fails."""
    d = tmp_path / "fake"
    d.mkdir()
    cfg = dict(SMOLLM2_SHAPE, hidden_size=256, intermediate_size=512, num_attention_heads=4,
               num_key_value_heads=2, num_hidden_layers=2, vocab_size=512)
    cfg.update(overrides)
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "model.safetensors").write_bytes(b"not a safetensors file")
    return d


def test_group_size_refused_before_loading_weights(tmp_path):
    src = _fake_model_dir(tmp_path, intermediate_size=320)  # down_proj reads 320 = 2.5 x 128
    out = tmp_path / "out"
    with pytest.raises(GroupSizeError) as err:
        quantize(src, out, algorithm="awq", group_size=128, num_samples=1, seq_len=8)
    msg = str(err.value)
    assert "mlp.down_proj" in msg and "320" in msg and "group size 128" in msg
    assert "use group size 64" in msg
    assert err.value.offenders == [("model.layers.0.mlp.down_proj", 320), ("model.layers.1.mlp.down_proj", 320)]
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake"]  # no staging folder left


def test_pickle_checkpoint_refused(tmp_path):
    src = tmp_path / "pickled"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(SMOLLM2_SHAPE))
    (src / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(RaipackError, match=r"pytorch_model\.bin.*safetensors only"):
        quantize(src, tmp_path / "out", algorithm="rtn", group_size=64)
    assert not (tmp_path / "out").exists()


def test_unknown_algorithm_and_dtype_rejected(tiny_llama, tmp_path):
    with pytest.raises(RaipackError, match="algorithm 'smoothquant' is not supported"):
        quantize(tiny_llama, tmp_path / "o", algorithm="smoothquant")
    with pytest.raises(RaipackError, match="dtype 'int8' is not supported"):
        quantize(tiny_llama, tmp_path / "o", dtype="int8")


def test_runtime_settings(monkeypatch):
    env = runtime_env(threads=2)
    assert env["OMP_NUM_THREADS"] == "2" and env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert int(env["MALLOC_MMAP_THRESHOLD_"]) >= 1 << 28
    assert all(isinstance(v, str) for v in env.values())
    for key in env:  # restored (or removed again) after the test
        monkeypatch.delenv(key, raising=False)
    import torch

    def flushing() -> bool:  # a denormal float64 reads back as 0 when torch flushes them
        return torch.tensor([1e-323], dtype=torch.float64).item() == 0.0

    before, flushed_before = torch.get_num_threads(), flushing()
    try:
        applied = apply_runtime_settings(threads=1)
        assert applied["torch_threads"] == 1
        # torch can flush denormals on x86 (SSE3) only; there it must now do so
        x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
        assert applied["flush_denormal"] is x86
        assert flushing() is x86
        if sys.platform.startswith("linux"):
            assert applied["mallopt"] is True
        assert os.environ["OMP_NUM_THREADS"] == "1"
    finally:
        torch.set_num_threads(before)
        torch.set_flush_denormal(flushed_before)


def test_quark_compiles_unless_told_or_without_a_cpp_compiler(monkeypatch):
    """Quark's torch.compile of its fake quantizer halves AWQ's scale-search memory at 8B width (issue 41):
    the stage keeps it where torch's inductor finds a C++ compiler (torch's own search decides), and turns
    it off with Quark's switch where none is found or the user says so."""
    from torch._inductor import config as inductor

    monkeypatch.delitem(sys.modules, "quark.torch.utils.constants", raising=False)  # as before Quark's import
    monkeypatch.delenv("QUARK_DISABLE_COMPILE", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    with inductor.patch({"cpp.cxx": (None, sys.executable)}):  # answers --version like a compiler
        assert quark_compile() == (True, "Quark's default on linux")
    assert "QUARK_DISABLE_COMPILE" not in os.environ
    with inductor.patch({"cpp.cxx": (None, "/nonexistent/g++")}):
        compiles, why = quark_compile()
    assert compiles is False and why.startswith("no C++ compiler for torch's inductor") and "/nonexistent/g++" in why
    assert os.environ["QUARK_DISABLE_COMPILE"] == "1"  # set before Quark reads it
    for value, expected in (("0", True), ("1", False)):
        monkeypatch.setenv("QUARK_DISABLE_COMPILE", value)
        assert quark_compile() == (expected, f"QUARK_DISABLE_COMPILE={value} in the environment")
    monkeypatch.delenv("QUARK_DISABLE_COMPILE")
    monkeypatch.setattr(sys, "platform", "win32")
    assert quark_compile()[0] is False and "QUARK_DISABLE_COMPILE" not in os.environ  # Quark's own default there
    monkeypatch.setitem(sys.modules, "quark.torch.utils.constants", types.SimpleNamespace(QUARK_DISABLE_COMPILE=False))
    assert quark_compile() == (True, "fixed when Quark was imported, before the stage")


def test_flush_denormal_is_off_again_after_the_run():
    """apply_runtime_settings turns the CPU's flush-denormal mode on for AWQ; it is process-wide, so the run
    turns it off again (it leaked into later stages and tests: BFP16's subnormal block scales read as 0)."""
    torch = pytest.importorskip("torch")
    from raipack.stages.quantize.runtime import restore_denormals

    def flushing() -> bool:
        return torch.tensor([1e-323], dtype=torch.float64).item() == 0.0

    before = torch.get_num_threads()
    try:
        if apply_runtime_settings(threads=1)["flush_denormal"]:
            assert flushing()
        restore_denormals()
        assert not flushing()
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------- Quark on the tiny model



RELEASE_PROBE = """
import ctypes, os
from raipack.stages.quantize.runtime import apply_runtime_settings, release_memory
apply_runtime_settings(threads=1)
if os.environ.get("RELEASE") == "1":
    assert release_memory() is True
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 256 << 20
rss = lambda: next(int(l.split()[1]) << 10 for l in open("/proc/self/status") if l.startswith("VmRSS:"))
start = rss()
block = libc.malloc(size)
ctypes.memset(block, 1, size)
held = rss()
libc.free(block)
print(held - start, held - rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc are Linux's")
def test_release_memory_ends_the_allocator_tuning():
    """After a quantize run the process goes on: freed memory must go back to the system, not stay
    with the heap as AWQ's tuning keeps it (a test worker grew to 12 GiB that way). Measured in a
    fresh process: a long-lived one may serve the block from a free chunk of its own heap."""
    import subprocess

    size = 256 << 20
    given_back = {}
    for release in ("0", "1"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        out = subprocess.run([sys.executable, "-c", RELEASE_PROBE], env={**env, "RELEASE": release}, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        touched, back = map(int, out.stdout.split())
        assert touched > size * 0.9  # the block was touched
        given_back[release] = back
    assert given_back["1"] > size * 0.9  # given back when freed, after release_memory
    assert given_back["0"] < size * 0.1  # and kept by the tuned allocator: what release_memory ends


def _check_export(out: Path, group: int, algo_name: str | None) -> dict:
    from safetensors import safe_open

    cfg = config_of(out)
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "quark"
    assert qc["kv_cache_quant_config"] == {}
    assert qc["exclude"] == ["lm_head"]
    assert qc["export"]["pack_method"] == "reorder"
    assert qc["export"]["weight_format"] == "real_quantized"
    w = qc["global_quant_config"]["weight"]
    assert (w["dtype"], w["qscheme"], w["group_size"], w["symmetric"]) == ("uint4", "per_group", group, False)
    assert qc["global_quant_config"]["input_tensors"] is None  # weights only
    if algo_name is None:
        assert not qc.get("algo_config")
    else:
        assert [a["name"] for a in qc["algo_config"]] == [algo_name]

    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    kv_out = cfg["num_key_value_heads"] * cfg["head_dim"]
    expected_in_out = {
        "self_attn.q_proj": (hidden, hidden),
        "self_attn.k_proj": (hidden, kv_out),
        "self_attn.v_proj": (hidden, kv_out),
        "self_attn.o_proj": (hidden, hidden),
        "mlp.gate_proj": (hidden, inter),
        "mlp.up_proj": (hidden, inter),
        "mlp.down_proj": (inter, hidden),
    }
    import torch

    with safe_open(str(out / "model.safetensors"), framework="pt") as st:
        keys = set(st.keys())
        for layer in range(cfg["num_hidden_layers"]):
            for name, (fin, fout) in expected_in_out.items():
                base = f"model.layers.{layer}.{name}"
                weight = st.get_tensor(f"{base}.weight")
                scale = st.get_tensor(f"{base}.weight_scale")
                zero = st.get_tensor(f"{base}.weight_zero_point")
                assert weight.dtype == torch.int32 and tuple(weight.shape) == (fin, fout // 8), base
                assert scale.dtype == torch.float32 and tuple(scale.shape) == (fin // group, fout), base
                assert zero.dtype == torch.int32 and tuple(zero.shape) == (fin // group, fout // 8), base
                assert torch.isfinite(scale).all() and (scale > 0).all()
        head = st.get_tensor("lm_head.weight")
        assert head.dtype == torch.float32 and "lm_head.weight_scale" not in keys
    return cfg


@pytest.fixture(scope="module")
def src_with_extras(tiny_llama, tmp_path_factory) -> Path:
    """The tiny model plus files Quark's export does not carry over."""
    src = tmp_path_factory.mktemp("src") / "model"
    shutil.copytree(tiny_llama, src)
    (src / "configuration_custom.py").write_text("# custom code shipped with the model\n")
    (src / "LICENSE").write_text("test licence\n")
    (src / "assets").mkdir()
    (src / "assets" / "note.txt").write_text("nested\n")
    return src


@pytest.fixture(scope="module")
def rtn_export(src_with_extras, tmp_path_factory):
    out = tmp_path_factory.mktemp("rtn") / "quark"
    record = quantize(src_with_extras, out, algorithm="rtn", group_size=128)
    return out, record


@pytest.fixture(scope="module")
def awq_export(src_with_extras, tmp_path_factory):
    out = tmp_path_factory.mktemp("awq") / "quark"
    events: list[tuple[str, int, int]] = []
    record = quantize(
        src_with_extras,
        out,
        algorithm="awq",
        group_size="auto",
        num_samples=3,
        seq_len=32,
        progress=lambda step, done, total: events.append((step, done, total)),
    )
    return out, record, events


def test_rtn_export_format(rtn_export):
    out, record = rtn_export
    _check_export(out, 128, None)
    assert record["algorithm"] == "rtn" and record["group_size"] == 128
    assert record["layers_quantized"] == 2 * 7
    assert record["calibration"] is None


def test_export_carries_every_source_file(rtn_export, src_with_extras):
    out, record = rtn_export
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
                 "README.md", "LICENSE", "configuration_custom.py"):
        assert (out / name).read_bytes() == (src_with_extras / name).read_bytes(), name
    assert (out / "assets" / "note.txt").read_text() == "nested\n"
    # Quark restores some auxiliary files itself; the rest (README, folders...) are ours
    assert {"README.md", "assets"} <= set(record["copied_files"])
    assert "config.json" not in record["copied_files"]
    # the source weights are never copied over the export
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model.safetensors"]


def test_rtn_record(rtn_export):
    _, record = rtn_export
    assert record["seconds"] > 0
    # loading, quantizing and exporting 14 layers costs CPU time, and no more than the cores give
    assert 0 < record["cpu_user_seconds"] <= record["seconds"] * os.cpu_count() + 0.02
    assert record["peak_rss_bytes"] > 50 * 2**20
    assert set(record["versions"]) == {"quark", "torch", "transformers"}
    assert record["versions"]["quark"].startswith("0.13")
    from quark.torch.utils import constants  # the record says what Quark did, not what was asked

    assert record["runtime"]["quark_compile"] is not constants.QUARK_DISABLE_COMPILE


def test_awq_export_format_and_progress(awq_export):
    out, record, events = awq_export
    _check_export(out, 128, "awq")
    assert record["group_size"] == 128 and record["group_size_requested"] == "auto"
    assert record["warnings"] == []
    assert record["calibration"] == {"num_samples": 3, "seq_len": 32, "tokens": 96}
    assert [e for e in events if e[0] == "calibration"] == [("calibration", i, 3) for i in (1, 2, 3)]
    assert [e for e in events if e[0] == "awq"] == [("awq", 1, 2), ("awq", 2, 2)]
    # the tiny model's searches fit awq_clip's bound: Quark's own batches (v_proj's 128 rows in 64s, the others 256)
    assert record["awq"]["clip_rows_per_call"] == [64, 256]


def test_gptq_export_format_and_progress(src_with_extras, tmp_path):
    events: list[tuple[str, int, int]] = []
    out = tmp_path / "quark"
    record = quantize(src_with_extras, out, algorithm="gptq", group_size=64, num_samples=2, seq_len=32,
                      progress=lambda *e: events.append(e))
    cfg = _check_export(out, 64, "gptq")
    assert cfg["quantization_config"]["algo_config"][0]["static_groups"] is True
    assert record["layers_quantized"] == 14
    assert [e for e in events if e[0] == "gptq"] == [("gptq", 1, 2), ("gptq", 2, 2)]


def test_awq_export_reloads_and_generates(awq_export):
    import torch

    from raipack.stages.quantize.quality import greedy_answer, load_hf, perplexity

    out, _, _ = awq_export
    model, tokenizer = load_hf(out)
    ids = tokenizer("The river carries sand.", return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = model(input_ids=ids).logits
    assert torch.isfinite(logits).all()
    ppl = perplexity(model, tokenizer, HELDOUT.read_text()[:600], max_len=64)
    assert math.isfinite(ppl) and ppl > 1
    # the answer is the greedy continuation of the chat-templated prompt, decoded without specials
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hello?"}], tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    new = []
    with torch.inference_mode():
        for _ in range(4):
            nxt = int(model(input_ids=ids).logits[0, -1].argmax())
            new.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
            if nxt == tokenizer.eos_token_id:
                break
    expected = tokenizer.decode(new, skip_special_tokens=True).strip()
    assert expected  # the tiny model's four tokens are not all special
    assert greedy_answer(model, tokenizer, "Hello?", max_new_tokens=4) == expected


def test_quality_probe_budget_and_dequantized_reload(awq_export, src_with_extras):
    """The probes' two savings keep their numbers: the reloaded export's linears dequantized once give the
    same logits, and the token budget scores exactly the first N held-out tokens (one forward)."""
    import torch

    from raipack.runtime.quark_hf import dequantize_once
    from raipack.stages.quantize.quality import load_hf, perplexity
    from raipack.stages.quantize.stage import measure

    out, record, _ = awq_export
    model, tokenizer = load_hf(out)
    ids = tokenizer(HELDOUT.read_text(), return_tensors="pt", add_special_tokens=False).input_ids[:, :24]
    with torch.inference_mode():
        before = model(input_ids=ids).logits
        assert dequantize_once(model) == record["layers_quantized"]
        after = model(input_ids=ids).logits
    assert torch.allclose(before, after, atol=1e-5)
    with torch.inference_mode():
        nll = torch.nn.functional.cross_entropy(after[0, :-1].float(), ids[0, 1:])
    assert perplexity(model, tokenizer, HELDOUT.read_text(), max_len=24, max_tokens=24) == pytest.approx(math.exp(nll.item()), rel=1e-5)
    q = measure(src_with_extras, out, HELDOUT.read_text(), dtype="bfloat16", tokens=24)
    assert q["tokens"] == 24 and q["dtype"] == "bfloat16" and math.isfinite(q["ppl_source"]) and math.isfinite(q["ppl_quantized"])
    assert q["ppl_source"] != pytest.approx(measure(src_with_extras, out, HELDOUT.read_text(), tokens=48)["ppl_source"], rel=1e-6)


def test_the_probes_answer_in_a_sentence_of_tokens(awq_export, src_with_extras, monkeypatch):
    """Each model's greedy answer is the full budget's answer_tokens at most (probes.json: 16; at 8B a step is ~0.8 s per model)."""
    from raipack.stages.quantize import quality
    from raipack.stages.quantize.stage import full_answer_tokens, measure

    asked, real = [], quality.greedy_answer
    monkeypatch.setattr(quality, "greedy_answer", lambda model, tok, prompt, max_new_tokens=32: asked.append(max_new_tokens) or real(model, tok, prompt, max_new_tokens))
    out, _, _ = awq_export
    q = measure(src_with_extras, out, HELDOUT.read_text(), tokens=8)
    assert asked == [full_answer_tokens()] * 2 == [16, 16] and q["answer_source"] and q["answer_quantized"] and q["answer_tokens"] == 16
    # a smaller budget (quality_tokens = "auto" above 2B forward parameters: budget.py) reaches both answers, and the record says what each part cost
    q = measure(src_with_extras, out, HELDOUT.read_text(), tokens=(8, 5))
    assert asked[2:] == [5, 5] and q["answer_tokens"] == 5
    parts = q["seconds_parts"]
    assert set(parts) == {"source_load_and_probe", "quantized_load", "quantized_dequantize", "quantized_probe"} and all(v >= 0 for v in parts.values())
    assert sum(parts.values()) <= q["seconds"] + 0.05


def test_dequantized_modules_are_freed_at_once_and_the_probe_owns_the_packed_weights(awq_export, src_with_extras, monkeypatch):
    """dequantize_once frees each packed module as it swaps it, without waiting for a garbage collection
    (fast_dequantize's reader refers back to its module: at 8B the packed linears held to the end were 3.3 GiB
    beside their bfloat16 copies); the probe first moves them out of the mapped file so their pages go too, and
    returns the heap they leave after each swap (Quark leaves glibc's heap wide and free: the 8B probe kept up to
    7.8 GiB of freed chunks resident without it)."""
    import gc
    import weakref

    from raipack.runtime import heap
    from raipack.runtime.quark_hf import dequantize_once
    from raipack.stages.quantize.quality import load_hf
    from raipack.stages.quantize.stage import measure

    out, record, _ = awq_export
    model, _ = load_hf(out)
    packed = [weakref.ref(m) for m in model.modules() if type(m).__name__ == "QParamsLinear"]
    assert len(packed) == record["layers_quantized"]
    weights = [weakref.ref(m.weight) for m in model.modules() if type(m).__name__ == "QParamsLinear"]
    alive = []  # after each swap (where the probe trims the heap) the swapped module's packed weight is already gone
    gc.disable()
    try:
        assert dequantize_once(model, after_each=lambda: alive.append(sum(r() is not None for r in weights))) == record["layers_quantized"]
        assert [r for r in packed if r() is not None] == []
    finally:
        gc.enable()
    assert alive == list(range(len(packed) - 1, -1, -1))
    trims = []
    monkeypatch.setattr(heap, "trim_heap", lambda: trims.append(1) or True)
    q = measure(src_with_extras, out, HELDOUT.read_text(), tokens=24)
    assert len(trims) == record["layers_quantized"] + 2  # each freed packed linear given back at once, and each model after its probe
    if sys.platform.startswith("linux"):  # /proc/self/maps: the packed weights were views of the mapped export
        assert q["quantized_weights_owned"]["tensors"] >= record["layers_quantized"] and q["quantized_weights_owned"]["bytes"] > 0


def test_the_source_probe_runs_on_the_model_quark_loads_so_the_source_is_read_once(src_with_extras, rtn_export, tmp_path, monkeypatch):
    """Issue 41: the stage's source probe runs on the float model Quark has loaded, before it quantizes (`before`), so
    the probes load only the quantized export; the source's perplexity and answer are the ones a separate load gives."""
    from raipack.stages.quantize import quality
    from raipack.stages.quantize.stage import measure, probe_source

    loads, real = [], quality.load_hf
    monkeypatch.setattr(quality, "load_hf", lambda folder, **kw: loads.append(Path(folder)) or real(folder, **kw))
    floats = []

    def before(model):
        floats.append({type(m).__name__ for m in model.modules() if "Linear" in type(m).__name__})
        return probe_source(model, src_with_extras, HELDOUT.read_text(), tokens=24)

    out = tmp_path / "quark"
    record = quantize(src_with_extras, out, algorithm="rtn", group_size="auto", before=before)
    assert floats == [{"Linear"}]  # the plain float model: Quark had not replaced a linear yet
    probe = record["source_probe"]
    assert "source_probe" not in rtn_export[1]  # no probe asked, none run
    q = measure(src_with_extras, out, HELDOUT.read_text(), tokens=24, source_probe=probe)
    assert loads == [out]  # the quantized export only: the source was not read from disk again
    separate = measure(src_with_extras, out, HELDOUT.read_text(), tokens=24)
    assert loads == [out, src_with_extras, out]
    assert q["ppl_source"] == pytest.approx(separate["ppl_source"], rel=1e-4) and q["answer_source"] == separate["answer_source"]
    assert q["ppl_quantized"] == separate["ppl_quantized"] and q["seconds"] >= probe["seconds"] > 0
    assert q["seconds_parts"]["source_probe"] == round(probe["seconds"], 2) and "source_load_and_probe" not in q["seconds_parts"]


def test_quality_probe_runs_the_quantized_model_in_the_stages_dtype(awq_export):
    """With dtype bfloat16 the reloaded export's float tensors and its dequantized linears are bfloat16
    (not a float32 copy of every linear), and its logits stay those of the float32 reload."""
    import torch

    from raipack.runtime.quark_hf import dequantize_once
    from raipack.stages.quantize.quality import load_hf

    out, record, _ = awq_export
    logits = {}
    for dtype in ("float32", "bfloat16"):
        model, tokenizer = load_hf(out, dtype=dtype)
        assert dequantize_once(model, dtype) == record["layers_quantized"]
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        assert {p.dtype for m in linears for p in m.parameters()} == {getattr(torch, dtype)} and model.get_input_embeddings().weight.dtype == getattr(torch, dtype)
        ids = tokenizer(HELDOUT.read_text(), return_tensors="pt", add_special_tokens=False).input_ids[:, :24]
        with torch.inference_mode():
            logits[dtype] = model(input_ids=ids).logits[0].float()
    cos = torch.nn.functional.cosine_similarity(logits["float32"], logits["bfloat16"], dim=-1)
    assert cos.min() > 0.99 and not torch.equal(logits["float32"], logits["bfloat16"])


def test_awq_weights_differ_from_rtn(rtn_export, awq_export, src_with_extras):
    """Same model, same group size: AWQ's activation-aware scaling changes the quantized
    weights and scales of the layers it scales, and folds the scales into the norms before
    them; RTN leaves every unquantized tensor as it was."""
    import torch
    from safetensors import safe_open

    (rtn, _), (awq, record, _) = rtn_export, awq_export
    assert record["algorithm"] == "awq" and record["calibration"]["tokens"] > 0
    with safe_open(str(rtn / "model.safetensors"), framework="pt") as r, safe_open(str(awq / "model.safetensors"), framework="pt") as a, \
            safe_open(str(src_with_extras / "model.safetensors"), framework="pt") as src:
        assert set(r.keys()) == set(a.keys())
        quantized = sorted(k.removesuffix(".weight_scale") for k in r.keys() if k.endswith(".weight_scale"))
        assert len(quantized) == 14
        differ = [q for q in quantized if not (torch.equal(r.get_tensor(f"{q}.weight"), a.get_tensor(f"{q}.weight"))
                                               and torch.equal(r.get_tensor(f"{q}.weight_scale"), a.get_tensor(f"{q}.weight_scale")))]
        scaled_norms = []
        for layer in range(config_of(rtn)["num_hidden_layers"]):
            for norm in ("input_layernorm", "post_attention_layernorm"):
                name = f"model.layers.{layer}.{norm}.weight"
                assert torch.equal(r.get_tensor(name), src.get_tensor(name)), f"RTN changed {name}"
                if not torch.equal(a.get_tensor(name), src.get_tensor(name)):
                    scaled_norms.append(name)
                    # the projections reading that norm were scaled by the inverse: their weights differ from RTN's
                    readers = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj") if norm == "input_layernorm" else ("mlp.gate_proj", "mlp.up_proj")
                    assert {f"model.layers.{layer}.{p}" for p in readers} <= set(differ), name
    assert scaled_norms, "AWQ folded no scale into any norm: it did nothing beyond RTN"
    assert len(differ) >= len(quantized) // 2, differ


def test_quantize_writes_only_into_a_new_or_empty_folder(src_with_extras, tmp_path):
    """quantize() never replaces a folder (the build runner stages and swaps) and writes nothing beside it."""
    out = tmp_path / "quark"
    out.mkdir()
    (out / "stale.txt").write_text("from an older build")
    with pytest.raises(RaipackError, match="quark is not an empty folder"):
        quantize(src_with_extras, out, algorithm="rtn", group_size=64)
    assert [p.name for p in out.iterdir()] == ["stale.txt"]
    (out / "stale.txt").unlink()
    quantize(src_with_extras, out, algorithm="rtn", group_size=64)
    assert config_of(out)["quantization_config"]["global_quant_config"]["weight"]["group_size"] == 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quark"]  # no staging or old folder left


# ----------------------------------------------------------------- calibration data


def test_bundled_corpus_sizes():
    assert 30_000 <= DEFAULT_CALIBRATION.stat().st_size <= 60_000
    assert 2_500 <= HELDOUT.stat().st_size <= 6_000
    assert len(read_texts(DEFAULT_CALIBRATION)) > 40
    # held-out paragraphs never appear in the calibration corpus
    calib = DEFAULT_CALIBRATION.read_text()
    for para in read_texts(HELDOUT):
        assert para[:80] not in calib


def _calibration_samples(path, tokenizer, num_samples: int, seq_len: int):
    """Calibration samples as the quantize stage makes them: a file's texts (or the bundled corpus) tokenized."""
    path = DEFAULT_CALIBRATION if path is None else path
    return tokenize_texts(read_texts(path), tokenizer, num_samples, seq_len, source=str(path))


def test_calibration_samples_txt_and_jsonl(tiny_tokenizer, tmp_path):
    import torch

    samples = _calibration_samples(None, tiny_tokenizer, 4, 64)
    assert len(samples) == 4
    assert all(s.dtype == torch.long and tuple(s.shape) == (1, 64) for s in samples)
    assert len({tuple(s[0, :8].tolist()) for s in samples}) == 4  # spread over the corpus

    jl = tmp_path / "c.jsonl"
    jl.write_text("\n".join(json.dumps({"text": p}) for p in read_texts(DEFAULT_CALIBRATION)[:10]) + "\n\n")
    assert len(_calibration_samples(jl, tiny_tokenizer, 2, 32)) == 2


@pytest.mark.parametrize(
    "name, content, pattern",
    [
        ("empty.txt", b"  \n\n", r"empty\.txt: calibration file is empty"),
        ("bad.jsonl", b'{"text": "ok"}\n{"text": oops}\n', r"bad\.jsonl:2: invalid JSON"),
        ("nokey.jsonl", b'{"text": "ok"}\n\n{"body": "x"}\n', r'nokey\.jsonl:3: expected an object with a "text" field'),
        ("type.jsonl", b'{"text": 5}\n', r'type\.jsonl:1: "text" must be a string, got int'),
        ("blank.jsonl", b'{"text": "  "}\n', r'blank\.jsonl: no line has a non-empty "text" field'),
        ("latin1.txt", b"line one\nline two caf\xe9\n", r"latin1\.txt:2: not valid UTF-8"),
        ("data.csv", b"a,b\n", r"data\.csv: unsupported calibration file type '\.csv'"),
    ],
)
def test_calibration_errors_name_file_and_line(tmp_path, tiny_tokenizer, name, content, pattern):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(RaipackError, match=pattern):
        _calibration_samples(path, tiny_tokenizer, 1, 4)


def test_calibration_missing_file_and_too_little_text(tmp_path, tiny_tokenizer):
    with pytest.raises(RaipackError, match=r"nope\.txt: calibration file not found"):
        _calibration_samples(tmp_path / "nope.txt", tiny_tokenizer, 1, 4)
    small = tmp_path / "small.txt"
    small.write_text("A few words only.\n")
    with pytest.raises(RaipackError, match=r"small\.txt: \d+ tokens give 0 windows of 512 tokens, 2 samples"):
        _calibration_samples(small, tiny_tokenizer, 2, 512)


# ----------------------------------------------------------------- dtype "auto", and the export without freeze()


@pytest.mark.parametrize(("config", "device", "expected"), [
    ({"torch_dtype": "bfloat16"}, "cpu", "bfloat16"),
    ({"dtype": "bfloat16"}, "cuda", "bfloat16"),  # transformers 5 writes "dtype"
    ({"torch_dtype": "float16"}, "cpu", "bfloat16"),
    ({"torch_dtype": "float16"}, "cuda", "float16"),
    ({"torch_dtype": "float32"}, "cpu", "float32"),
    ({}, "cpu", "float32"),
    ({"model_type": "gemma3", "text_config": {"torch_dtype": "bfloat16"}}, "cpu", "bfloat16"),
])
def test_auto_dtype_follows_the_source(config, device, expected):
    from raipack.stages.quantize.preflight import resolve_dtype

    assert resolve_dtype("auto", config, device) == expected
    assert resolve_dtype("float32", config, device) == "float32"  # an explicit dtype is kept


def test_stage_estimate_uses_the_resolved_dtype():
    """The runner's estimate for the default dtype counts a bfloat16 source's weights at 2 bytes."""
    from raipack.npu import profile
    from raipack.stages.quantize.stage import STAGE, QuantizeConfig

    cfg = {**SMOLLM2_SHAPE, "torch_dtype": "bfloat16", "tie_word_embeddings": True}
    target = profile.get("1.8.0-npu-16K")
    auto = STAGE.memory(QuantizeConfig(algorithm="rtn"), cfg, target)
    f32 = STAGE.memory(QuantizeConfig(algorithm="rtn", dtype="float32"), cfg, target)
    assert "in bfloat16" in auto.basis and "in float32" in f32.basis
    assert auto.bytes < f32.bytes


def test_bfloat16_source_is_quantized_in_bfloat16(tiny_llama, tmp_path):
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.bfloat16).save_pretrained(src)
    AutoTokenizer.from_pretrained(str(tiny_llama)).save_pretrained(src)
    record = quantize(src, tmp_path / "q", algorithm="rtn", group_size=128)
    assert (record["dtype"], record["dtype_requested"]) == ("bfloat16", "auto")
    with safe_open(str(tmp_path / "q" / "model.safetensors"), framework="pt") as st:
        assert st.get_tensor("model.layers.0.self_attn.q_proj.weight_scale").dtype == torch.bfloat16
        assert st.get_tensor("model.layers.0.self_attn.q_proj.weight").dtype == torch.int32


def test_export_without_freeze_is_the_frozen_export_in_float32(awq_export, src_with_extras, tmp_path, monkeypatch):
    """quantize() exports without Quark's freeze() (documented for torch.compile; it wrote a fake-quantized
    copy of every linear that the export rounded again). In float32 the packed tensors are the ones a
    freeze-then-export writes, bit for bit: AWQ with the awq_export fixture's settings, frozen this time."""
    import torch
    from quark.torch import ModelQuantizer
    from safetensors.torch import load_file

    original = ModelQuantizer.quantize_model
    frozen = []

    def quantize_then_freeze(self, model, *args, **kwargs):
        model = original(self, model, *args, **kwargs)
        frozen.append(True)
        return ModelQuantizer.freeze(model)

    monkeypatch.setattr(ModelQuantizer, "quantize_model", quantize_then_freeze)
    out = tmp_path / "frozen"
    quantize(src_with_extras, out, algorithm="awq", group_size="auto", num_samples=3, seq_len=32)
    assert frozen == [True]
    mine, theirs = load_file(str(awq_export[0] / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert set(mine) == set(theirs)
    differ = [k for k in mine if not torch.equal(mine[k], theirs[k])]
    assert differ == []


def _quark_linears(model) -> list:
    return [m for m in model.modules() if type(m).__name__ == "QParamsLinear"]


def test_fast_dequantize_reads_quarks_weights_bit_for_bit(awq_export):
    """The export's parity dequantizes every linear on every forward: raipack's reader of Quark's uint4
    "reorder" packing gives Quark's own float32 weights exactly, for every linear, and replaces Quark's."""
    import torch

    from raipack.runtime.quark_hf import fast_dequantize
    from raipack.stages.quantize.quality import load_hf

    out, record, _ = awq_export
    model, _ = load_hf(out)
    linears = _quark_linears(model)
    with torch.no_grad():
        theirs = [m._get_qweight(m.weight).clone() for m in linears]
        assert fast_dequantize(model) == {"modules": record["layers_quantized"], "quark": 0}
        mine = [m._get_qweight(m.weight) for m in linears]
    assert len(linears) == record["layers_quantized"]
    assert all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(theirs, mine))


def test_fast_dequantize_keeps_quarks_code_when_it_would_differ(awq_export, monkeypatch):
    import raipack.runtime.quark_hf as quark_hf
    from raipack.stages.quantize.quality import load_hf

    out, record, _ = awq_export
    model, _ = load_hf(out)
    real = quark_hf._dequantize
    monkeypatch.setattr(quark_hf, "_dequantize", lambda mod: real(mod) + 1e-3)  # a reader that misreads
    assert quark_hf.fast_dequantize(model) == {"modules": 0, "quark": record["layers_quantized"]}
    assert all("_get_qweight" not in m.__dict__ for m in _quark_linears(model))
    # a layout it does not read (Quark's "order" packing, say) is left to Quark, the others still go fast
    model, _ = load_hf(out)
    monkeypatch.setattr(quark_hf, "_dequantize", real)
    first = _quark_linears(model)[0]
    first.weight_quantizer.reorder = False
    assert quark_hf.fast_dequantize(model) == {"modules": record["layers_quantized"] - 1, "quark": 1}
    assert "_get_qweight" not in first.__dict__


def test_the_heap_is_trimmed_after_each_decoder_layer(monkeypatch):
    """Quark's AWQ/GPTQ layer loops are wrapped: after each layer the heap's free pages go back
    (runtime.trim_heap), with or without a progress callback; the loops are Quark's own again afterwards."""
    import importlib

    import raipack.stages.quantize.quark_loops as loops

    trims, events = [], []
    monkeypatch.setattr(loops, "trim_heap", lambda: trims.append(1) or True)
    awq = importlib.import_module("quark.torch.algorithm.awq.awq")
    original = awq.tqdm
    for progress in (None, lambda step, done, total: events.append((step, done, total))):
        trims.clear()
        with loops.report_layers(progress):
            assert list(awq.tqdm(range(3), desc="AWQ")) == [0, 1, 2]
        assert len(trims) == 3
        assert awq.tqdm is original
    assert events == [("awq", 1, 3), ("awq", 2, 3), ("awq", 3, 3)]


def test_after_each_runs_after_the_items_of_matching_loops_only(monkeypatch):
    """after_each (both wrappers above are made of it) calls back after each item of a loop whose description
    matches, with its count and total, leaves other loops alone, and puts the module's tqdm back, also on error."""
    import types

    import raipack.stages.quantize.quark_loops as loops

    module = types.ModuleType("fake_quark_loops")
    module.tqdm = lambda iterable=None, *args, **kwargs: iter(iterable)
    original = module.tqdm
    monkeypatch.setitem(sys.modules, "fake_quark_loops", module)
    calls: list = []
    with loops.after_each("fake_quark_loops", lambda i, total: calls.append((i, total)), "Converting"):
        assert list(module.tqdm(range(2), desc="Converting QuantLinear")) == [0, 1]
        assert list(module.tqdm(range(3), desc="Loading")) == [0, 1, 2]
    assert calls == [(1, 2), (2, 2)] and module.tqdm is original
    with pytest.raises(ValueError), loops.after_each("fake_quark_loops", lambda i, total: None):
        raise ValueError("inside")
    assert module.tqdm is original


TRIM_PROBE = """
import ctypes
from raipack.stages.quantize.runtime import apply_runtime_settings, trim_heap
apply_runtime_settings(threads=1)
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 256 << 20
rss = lambda: next(int(l.split()[1]) << 10 for l in open("/proc/self/status") if l.startswith("VmRSS:"))
block = libc.malloc(size)
ctypes.memset(block, 1, size)
after = libc.malloc(1 << 20)  # a live chunk above the freed one: its pages are in the middle of the heap
ctypes.memset(after, 1, 1 << 20)
libc.free(block)
kept = rss()
assert trim_heap() is True
print(kept - rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim and /proc are Linux's")
def test_trim_heap_gives_the_freed_middle_of_the_heap_back():
    """The tuned allocator keeps what AWQ frees inside a layer; trim_heap (after each layer) returns the free
    pages also below a live chunk, while the tuning stays on. Measured in a fresh process, as above."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", TRIM_PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > (256 << 20) * 0.9


def test_the_heap_is_trimmed_after_each_linear_the_export_converts(awq_export, src_with_extras, tmp_path, monkeypatch):
    """Quark's export releases each linear's float weight in the middle of the heap: quantize() trims after each
    conversion (and only there), and the export is the same file."""
    from safetensors.torch import load_file

    import raipack.stages.quantize.quark_awq as qa
    import raipack.stages.quantize.quark_loops as loops

    trims = []
    monkeypatch.setattr(loops, "trim_heap", lambda: trims.append(1) or True)
    out = tmp_path / "q"
    record = qa.quantize(src_with_extras, out, algorithm="awq", group_size="auto", num_samples=3, seq_len=32)
    layers = record["decoder_layers"]
    assert len(trims) == record["layers_quantized"] + layers  # one per converted linear, one per AWQ layer
    mine, before = load_file(str(out / "model.safetensors")), load_file(str(awq_export[0] / "model.safetensors"))
    assert set(mine) == set(before) and all((mine[k] == before[k]).all() for k in mine)


def test_awq_with_its_clipping_search_split_into_rows_writes_the_same_export(awq_export, src_with_extras, tmp_path, monkeypatch):
    """The whole stage with Quark's clipping search seeing a few rows at a time (awq_clip.py) writes the file the
    awq_export fixture wrote with Quark's batches, tensor for tensor."""
    import torch
    from safetensors.torch import load_file

    from raipack.stages.quantize import awq_clip

    limits = awq_clip.clip_limits()
    sampled = awq_clip.sampled_tokens(3 * 32, limits["sample_tokens"])
    element = torch.empty(0, dtype=getattr(torch, awq_export[1]["dtype"])).element_size()
    monkeypatch.setattr(awq_clip, "clip_limits", lambda: {**limits, "chunk_bytes": 37 * sampled * 256 * element})
    out = tmp_path / "q"
    record = quantize(src_with_extras, out, algorithm="awq", group_size="auto", num_samples=3, seq_len=32)
    assert record["awq"]["clip_rows_per_call"] == [18, 37]  # down_proj reads 512 inputs, the others 256
    mine, before = load_file(str(out / "model.safetensors")), load_file(str(awq_export[0] / "model.safetensors"))
    assert set(mine) == set(before) and [k for k in mine if not torch.equal(mine[k], before[k])] == []


def test_the_plain_loader_reads_an_awq_export_as_quark_does(awq_export):
    """AWQ folds its scales into the weights before they are packed: its export is the same scheme as RTN's, so the
    export's parity loads it without Quark (raipack.runtime.quark_plain) and gets the logits of its Quark path (Quark's
    modules with raipack's reader, fast_dequantize) bit for bit. Quark's own unpacking gives the same weights (test
    above) in another memory layout, whose matrix product sums in another order: within 1e-5 of those."""
    import torch

    from raipack.runtime.quark_hf import fast_dequantize
    from raipack.runtime.quark_plain import load_plain
    from raipack.stages.quantize.quality import load_hf

    out, record, _ = awq_export
    plain = load_plain(out)
    assert plain is not None and sum(type(m).__name__ == "PackedLinear" for m in plain.modules()) == record["layers_quantized"]
    theirs, _ = load_hf(out)
    ids = torch.tensor([[1, 5, 9, 17, 33, 65, 2]])
    with torch.no_grad():
        mine, quarks = plain(input_ids=ids).logits, theirs(input_ids=ids).logits
        assert fast_dequantize(theirs)["modules"] == record["layers_quantized"]
        assert torch.equal(mine, theirs(input_ids=ids).logits)
    assert torch.allclose(mine, quarks, rtol=0, atol=1e-5)
