"""bench/real_size.py's own instruments, fast: the model writer and the per-process peak memory.
(The real-size build itself is `make bench-real`, never part of `make test`.)"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "real_size.py"
spec = importlib.util.spec_from_file_location("real_size", BENCH)
real_size = importlib.util.module_from_spec(spec)
spec.loader.exec_module(real_size)

SMALL = {**real_size.LLAMA_32_1B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1000}


def test_written_checkpoint_is_the_llama_state_dict_in_bf16(tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    path = tmp_path / "model.safetensors"
    size = real_size.write_bf16_safetensors(path, real_size.tensor_shapes(SMALL), std=0.02, seed=3)
    tensors = load_file(str(path))
    fields = {k: v for k, v in SMALL.items() if k not in ("architectures", "model_type", "torch_dtype")}
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **fields))
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied to the embedding
    assert {k: tuple(v.shape) for k, v in tensors.items()} == expected
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    assert size == path.stat().st_size == 8 + int.from_bytes(path.read_bytes()[:8], "little") + 2 * sum(int(np.prod(s)) for s in expected.values())
    emb = tensors["model.embed_tokens.weight"].float()
    assert 0.015 < emb.std().item() < 0.025 and torch.equal(tensors["model.norm.weight"].float(), torch.ones(64))
    again = tmp_path / "again.safetensors"
    real_size.write_bf16_safetensors(again, real_size.tensor_shapes(SMALL), std=0.02, seed=3)
    assert again.read_bytes() == path.read_bytes()  # a fixed seed: the same model every run


def test_real_dimensions_are_llama_3_2_1b():
    shapes = dict(real_size.tensor_shapes(real_size.LLAMA_32_1B))
    params = sum(int(np.prod(s)) for s in shapes.values())
    assert 1.23e9 < params < 1.24e9  # Llama-3.2-1B: 1.236B parameters, head tied
    assert "lm_head.weight" not in shapes and shapes["model.embed_tokens.weight"] == (128256, 2048)
    assert shapes["model.layers.15.self_attn.k_proj.weight"] == (512, 2048) and "model.layers.16.mlp.up_proj.weight" not in shapes


def test_peak_rss_is_the_child_own_not_the_parent_size(tmp_path):
    ballast = np.ones(400 << 20, np.uint8)  # 400 MiB resident in this process before the fork
    run = real_size.measured(["--help"], dict(os.environ), tmp_path, sample_s=0.02)
    assert run["rc"] == 0 and "Usage" in run["stdout"]
    assert 10 << 20 < run["peak_rss"] < ballast.nbytes  # the child's own VmHWM, from its /proc at exit
    assert 0 < run["peak_anon"] <= run["peak_rss"] and 0 < run["cpu_s"] <= run["wall_s"] * 2  # sampled RssAnon; the child's CPU time


def test_each_model_is_its_published_size_and_the_tool_time_comes_from_the_stage_report():
    from raipack.npu.dims import parameter_count

    sizes = {name: parameter_count(cfg) for name, cfg in real_size.MODELS.items()}
    assert sizes == {"llama-3.2-1b": 1_235_814_400, "llama-3.2-3b": 3_212_749_824, "llama-3.1-8b": 8_030_261_248}
    assert sum(int(np.prod(s)) for _, s in real_size.tensor_shapes(real_size.MODELS["llama-3.1-8b"])) == sizes["llama-3.1-8b"]  # untied lm_head written
    assert real_size.tool_seconds("quantize", {"seconds_load": 1.0, "seconds_quantize": 10.25, "seconds_export": 2.0, "seconds": 30}) == 13.2
    assert real_size.tool_seconds("export", {"builder_seconds": 7.84, "seconds": 20}) == 7.8
    assert real_size.tool_seconds("smoke", {"seconds_package": 3.04, "seconds_perplexity": 1.0, "seconds_export_check": 0.5}) == 3.0
    assert real_size.checks_seconds("smoke", {"seconds_package": 3.04, "seconds_perplexity": 1.0, "seconds_export_check": 0.56}) == 1.6
    assert real_size.tool_seconds("fuse", {"seconds": 5}) is None and real_size.tool_seconds("quantize", {}) is None
    # raipack's own checks inside the stage: the quality probes, parity
    assert real_size.checks_seconds("quantize", {"quality": {"seconds": 12.34}}) == 12.3
    assert real_size.checks_seconds("export", {"parity": {"seconds": 40.06}, "builder_seconds": 7}) == 40.1
    assert real_size.checks_seconds("export", {"builder_seconds": 7}) is None and real_size.checks_seconds("fuse", {"seconds": 2}) is None


def test_failed_stage_row_keeps_the_error(tmp_path, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))  # no weights: refused before any stage
    recipe = real_size.write_recipe(model, "rtn", tmp_path / "out", tmp_path, None)
    rows = real_size.build_stages(["--recipe", str(recipe)], "rtn", tmp_path / "out", {**os.environ, "RAIPACK_CACHE": str(tmp_path / "cache")})
    assert len(rows) == 1 and rows[0]["rc"] == 2 and rows[0]["status"] == "failed"
    assert rows[0]["cache"] == "warm" and rows[0]["resident_bytes"] == 0  # cold is main's default; no weights in the work folder
    assert "safetensors" in rows[0]["error"]


def test_table_shows_each_stage_and_the_package_rows():
    row = {"algorithm": "rtn", "stage": "quantize", "status": "built", "cache": "cold", "stage_s": 61.5, "process_s": 80.2, "cpu_s": 75.0, "tool_s": 40.5, "checks_s": 9.5,
           "peak_rss": 3 << 30, "peak_anon": 2 << 30, "estimate": 5 << 29, "summary": "rtn uint4 g128", "rc": 0}
    failed = {**row, "stage": "export", "status": "failed", "stage_s": None, "tool_s": None, "checks_s": None, "estimate": None, "summary": "", "rc": 1, "error": "log\nERROR: parity failed"}
    pkg = {"validate": {"validate_s": 0.41, "imports_s": 0.2, "ratio": 2.05, "rc": 0, "files": 180, "bytes": 3 << 30},
           "decode": {"reference_tps": 12.0, "oga_tps": 10.0, "ratio": 1.2, "run_s": 9.0, "run_peak_rss": 1 << 30, "run_stats": "[cpu-reference] 64 tokens"}}
    text = real_size.table({"rows": [row, failed], "packages": {"rtn": pkg}})
    assert "| rtn | quantize | built | cold | 61.5 | 80.2 | 75.0 | 40.5 | 1.52x | 9.5 | 3.00 GiB | 2.00 GiB | – | ≤ 14 GiB | 2.50 GiB | 0.83x | rtn uint4 g128 |" in text
    assert "| rtn | export | failed | cold | – |" in text and "| 75.0 | – | – | – | " in text and "ERROR: parity failed" in text
    awq = real_size.table({"rows": [{**row, "algorithm": "awq"}, failed, row], "packages": {}})
    assert [line.split("|")[1:3] for line in awq.splitlines()[2:5]] == [[" rtn ", " quantize "], [" rtn ", " export "], [" awq ", " quantize "]]  # RTN first, stages in order
    assert "0.41 s (180 files, 3.00 GiB) | 0.20 s | 2.05x | 0 | 12.0 tok/s | 10.0 tok/s | 1.20x |" in text


def test_a_stage_over_14_gib_is_judged_against_its_tool_run_alone():
    """Issue 41's memory line: a peak within a 16 GB machine's 14 GiB, or within 1 GiB of the stage's outside tool run
    alone on the same input (bench/tool_alone.py writes those rows into the same result file)."""
    gib = 1 << 30
    alone = {"rc": 0, "wall_s": 300.5, "peak_rss": 16 * gib, "cache": "cold"}
    assert real_size.memory_verdict(14 * gib, None) == "≤ 14 GiB"
    assert real_size.memory_verdict(int(16.5 * gib), alone) == "tool alone +0.50 GiB"
    assert real_size.memory_verdict(15 * gib, alone) == "tool alone -1.00 GiB"
    assert real_size.memory_verdict(int(17.5 * gib), alone) == "tool alone +1.50 GiB (over 1 GiB)"
    assert real_size.memory_verdict(15 * gib, None) == real_size.memory_verdict(15 * gib, {**alone, "rc": 1}) == "over 14 GiB, tool alone not measured"
    row = {"algorithm": "awq", "stage": "quantize", "status": "built", "cache": "cold", "stage_s": 900.0, "process_s": 905.0, "cpu_s": 1500.0, "tool_s": 800.0,
           "checks_s": 60.0, "peak_rss": int(16.5 * gib), "peak_anon": 16 * gib, "estimate": 20 * gib, "summary": "awq", "rc": 0}
    text = real_size.table({"rows": [row, {**row, "stage": "export"}], "packages": {}, "tool_alone": {"quantize/awq": alone}})
    assert "| 16.50 GiB | 16.00 GiB | 300.5 s, 16.00 GiB (cold) | tool alone +0.50 GiB | 20.00 GiB |" in text
    assert "| 16.00 GiB | – | over 14 GiB, tool alone not measured |" in text  # the export's builder was not measured alone
    # a tool alone killed for memory (Quark's AWQ at 8B on 24 GiB) above the stage's whole peak: the stage is below it
    killed = {"rc": -9, "wall_s": 560.9, "peak_rss": None, "peak_anon": 23 * gib, "cache": "cold"}
    assert real_size.memory_verdict(int(18.5 * gib), killed) == "tool alone failed at ≥ 23.00 GiB: the stage -4.50 GiB"
    assert real_size.memory_verdict(24 * gib, killed) == "over 14 GiB, tool alone not measured"  # failed below the stage's peak: no verdict
    text = real_size.table({"rows": [row], "packages": {}, "tool_alone": {"quantize/awq": killed}})
    assert "| failed (exit -9) after 560.9 s, RssAnon ≥ 23.00 GiB when it ended | tool alone failed at ≥ 23.00 GiB: the stage -6.50 GiB |" in text


def test_a_tool_alone_reports_its_own_peak_time_and_timings(tmp_path):
    """bench/tool_alone.py's runner: the child's own VmHWM (not this process's), its sampled RssAnon, its JSON timings; a failing tool its error."""
    import sys

    sys.path.insert(0, str(BENCH.parent))
    try:
        import tool_alone
    finally:
        sys.path.remove(str(BENCH.parent))
    code = "import json, sys\nimport numpy as np\nb = np.ones(int(sys.argv[1]) << 20, np.uint8)\nprint(json.dumps({'mib': int(sys.argv[1])}))"
    ballast = np.ones(300 << 20, np.uint8)  # resident here, not in the child
    run = tool_alone.run_tool(code, ["120"], tmp_path, sample_s=0.02)
    assert run["rc"] == 0 and run["timings"] == {"mib": 120} and run["error"] == ""
    assert 120 << 20 < run["peak_rss"] < ballast.nbytes and 0 < run["peak_anon"] <= run["peak_rss"]
    bad = tool_alone.run_tool("raise SystemExit('no model here')", [], tmp_path)
    assert bad["rc"] == 1 and bad["timings"] is None and "no model here" in bad["error"]
    with pytest.raises(SystemExit, match="no quantize stage output"):
        tool_alone.stage_dir(tmp_path, "rtn", "quantize")


def _rerun(tmp_path, monkeypatch, earlier: dict, first: str, until: str) -> tuple[dict, dict]:
    """run_all over an earlier result file `earlier`, measuring stage `first` again (a fake build: one new row for
    that stage, marked "new"); the result file as it is then, and what build_stages was asked."""
    import argparse

    monkeypatch.setattr(real_size, "HERE", tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "real_size_llama-3.2-1b.json").write_text(json.dumps(earlier))
    seen = {}

    def fake_build(build_args, algorithm, out_root, env, on_row=None, plan=real_size.WARM_FROM_START):
        first = seen["first"] = plan.first
        seen["cold"] = plan.cold
        row = {"algorithm": algorithm, "stage": first, "status": "built", "rc": 0, "new": True}
        on_row(row)
        return [row]

    monkeypatch.setattr(real_size, "build_stages", fake_build)
    monkeypatch.setattr(real_size, "warm_bytecode", lambda env: {"seconds": 0.0, "rc": 0, "env_has_flag": "PYTHONDONTWRITEBYTECODE" in env})
    work = tmp_path / "work"
    (work / "llama-3.2-1b-random").mkdir(parents=True)
    (work / "llama-3.2-1b-random" / "model.safetensors").write_bytes(b"")  # an earlier run's model: not written again
    args = argparse.Namespace(model="llama-3.2-1b", tiny=False, algorithms="rtn", smoke_max_tier=None, ignore_memory=False, warm=False, until=until, first=first)
    assert real_size.run_all(args, work) == 0
    return json.loads((tmp_path / "out" / "real_size_llama-3.2-1b.json").read_text()), seen


def test_from_measures_the_later_stages_and_keeps_the_earlier_rows(tmp_path, monkeypatch):
    """--from smoke: only smoke is measured again; the earlier stages' rows of that algorithm, and the other algorithm's, stay."""
    old = [{"algorithm": "rtn", "stage": s, "status": "built", "rc": 0} for s in ("quantize", "export", "fuse", "smoke")]
    doc, seen = _rerun(tmp_path, monkeypatch, {"rows": [*old, {"algorithm": "awq", "stage": "smoke", "rc": 0}], "packages": {}}, "smoke", "smoke")
    rows = doc["rows"]
    assert seen["first"] == "smoke" and seen["cold"] is True  # each stage measured cold unless --warm
    assert [(r["algorithm"], r["stage"], r.get("new", False)) for r in rows] == [
        ("rtn", "quantize", False), ("rtn", "export", False), ("rtn", "fuse", False), ("awq", "smoke", False), ("rtn", "smoke", True)]
    with pytest.raises(SystemExit):  # a stage name it does not know is a usage error, not a traceback
        real_size.main(["--from", "smok"])


def test_from_and_until_one_stage_measure_it_again_and_keep_every_other_row(tmp_path, monkeypatch):
    """--from quantize --until quantize: quantize is measured again; the later stages' rows (and the package's) stay."""
    old = [{"algorithm": "rtn", "stage": s, "status": "built", "rc": 0} for s in ("quantize", "export", "fuse", "smoke")]
    alone = {"quantize/rtn": {"tool": "quark", "rc": 0, "peak_rss": 1 << 30, "wall_s": 1.0}}
    doc, _ = _rerun(tmp_path, monkeypatch, {"rows": old, "packages": {"rtn": {"validate": {"rc": 0}}}, "tool_alone": alone}, "quantize", "quantize")
    assert sorted((r["stage"], r.get("new", False)) for r in doc["rows"]) == [("export", False), ("fuse", False), ("quantize", True), ("smoke", False)]
    assert doc["packages"] == {"rtn": {"validate": {"rc": 0}}}
    assert doc["tool_alone"] == alone  # bench/tool_alone.py's rows stay beside the stage measured again


def test_a_user_who_cannot_drop_the_page_cache_gets_a_warm_row_that_says_why(tmp_path):
    """Issue 41: a stage is measured cold only when the cache was dropped; otherwise the row says warm and why."""
    import page_cache

    control = tmp_path / "ro" / "drop_caches"  # a control file that cannot be opened for writing, as for a user who is not root
    state = page_cache.prepare(True, [], control)
    assert state["cache"] == "warm" and str(control) in state["cache_note"] and "only root" in state["cache_note"]
    assert page_cache.prepare(False, [])["cache"] == "warm"


def test_cold_means_the_files_left_the_page_cache(tmp_path):
    """The real drop, where this user may write /proc/sys/vm/drop_caches (root): a file just written and read is
    resident before and not after, as util-linux's fincore counts it."""
    import page_cache

    if not os.access(page_cache.DROP_CACHES, os.W_OK):
        pytest.skip(f"{page_cache.DROP_CACHES} is not writable by this user (not root): the drop itself cannot be shown; its refusal is tested above")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(os.urandom(8 << 20))
    weights.read_bytes()
    assert page_cache.resident_bytes([weights]) > 4 << 20
    state = page_cache.prepare(True, [weights])
    assert state["cache"] == "cold" and state["resident_bytes"] < 1 << 20, state


def test_children_write_bytecode_as_a_users_python_does(tmp_path, monkeypatch):
    """A shell with PYTHONDONTWRITEBYTECODE=1 would make every stage compile torch's, transformers' and Quark's sources
    (Quark's import: 8.5 s, 6.4 s of it compile()): the children's environment drops it, and the warm-up import writes
    the .pyc the measured processes then read."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = real_size.user_env({**__import__("os").environ, "KEEP": "me"})
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["KEEP"] == "me"
    (tmp_path / "warm_me.py").write_text("X = 1\n")
    monkeypatch.setattr(real_size, "WARM_IMPORTS", f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import warm_me")
    done = real_size.warm_bytecode(env)
    assert done["rc"] == 0 and done["dont_write_bytecode_dropped"] is True
    assert list((tmp_path / "__pycache__").glob("warm_me.*.pyc"))
    (tmp_path / "__pycache__").rename(tmp_path / "old")
    assert real_size.warm_bytecode(dict(__import__("os").environ))["rc"] == 0 and not (tmp_path / "__pycache__").exists()  # the flag kept: none


def test_children_build_torch_extensions_in_this_checkouts_own_folder(monkeypatch):
    """torch rebuilds Quark's extension whenever another install used the shared per-user folder last (4-6 s inside the
    first BFP16 load of a smoke stage, session 16): the children get this checkout's folder, a user's own setting kept;
    the warm-up builds both extensions (the quantize stage's and the BFP16 operator's) before any stage is measured."""
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    env = real_size.user_env(dict(__import__("os").environ))
    assert env["TORCH_EXTENSIONS_DIR"] == str(real_size.ROOT / ".venv" / "torch-extensions")
    assert Path(env["TORCH_EXTENSIONS_DIR"]).is_absolute()  # raipack refuses a relative one (core/libraries.py)
    assert real_size.user_env({"TORCH_EXTENSIONS_DIR": "/opt/ext"})["TORCH_EXTENSIONS_DIR"] == "/opt/ext"
    assert "import_quark()" in real_size.WARM_IMPORTS and "quark_library()" in real_size.WARM_IMPORTS


def test_from_forgets_each_measured_stages_cache_entry_and_the_decode_folder_is_made_afresh(tmp_path):
    """--from STAGE measures that stage again: its cache entry (the earlier build's *.stages/NAME link) is removed before it
    runs, not reused as a 0-second cache hit; the decode row's export folder of an earlier run is replaced, not a crash."""
    entry = tmp_path / "cache" / "stages" / "export" / "abc"
    entry.mkdir(parents=True)
    (entry / "model.onnx").write_bytes(b"x")
    out_root = tmp_path / "build-rtn"
    (out_root / "pkg.stages").mkdir(parents=True)
    (out_root / "pkg.stages" / "export").symlink_to(entry)
    assert real_size.forget(out_root, "export") == str(entry) and not entry.exists()
    assert real_size.forget(out_root, "export") is None and real_size.forget(out_root, "smoke") is None
    export = tmp_path / "export"
    export.mkdir()
    (export / "genai_config.json").write_text("{}")
    (export / "model.onnx").write_bytes(b"graph")
    first = real_size.writable_export(export, tmp_path)
    again = real_size.writable_export(export, tmp_path)
    assert first == again and (again / "model.onnx").read_bytes() == b"graph" and not (again / "genai_config.json").is_symlink()
