"""Export stage: builder wrapper, output contract checks, the plain-onnxruntime loop, parity."""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from raipack.stages.export import contract
from raipack.stages.export.contract import (
    external_data_refs,
    io_contract,
    matmulnbits_agreement,
)
from shared_fixtures import HELDOUT_TEXT, PROMPTS


def _load(folder: Path) -> onnx.ModelProto:
    return onnx.load(str(folder / "model.onnx"), load_external_data=False)


def _genai(folder: Path) -> dict:
    return json.loads((folder / "genai_config.json").read_text())


def _ops(model) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def _pointers(findings) -> set[str]:
    return {f.pointer for f in findings}


def _output_errors(folder: Path) -> list:
    """The export's output check as the build runner runs it: `raipack validate` with the
    oga-export profile; its error-level findings."""
    from raipack.validate import validate

    return [f for f in validate(folder, "oga-export").findings if f.severity == "error"]


# --- builder -------------------------------------------------------------------------------------


def test_default_export_keeps_quark_exclusions_float(oga_default, tiny_quark):
    folder, report = oga_default
    model = _load(folder)
    ops = _ops(model)
    assert ops["GatherBlockQuantized"] == 0
    assert ops["MatMulNBits"] == 2 * 5  # qkv (packed), o, gate, up, down per layer; no lm_head
    lm_head = [n for n in model.graph.node if n.name.startswith("/lm_head/")]
    assert [n.op_type for n in lm_head] == ["MatMul"]
    assert all(
        {a.name: a.i for a in n.attribute}["block_size"] == 128 for n in model.graph.node if n.op_type == "MatMulNBits"
    )
    assert report["nodes_to_exclude"] == ["/lm_head/MatMul", "/model/embed_tokens/Gather"]
    assert report["extra_options"]["accuracy_level"] == "1"  # float activations, as Quark's weight-only scheme
    assert report["quark"] == {"group_size": 128, "bits": 4, "symmetric": False, "exclude": ["lm_head"]}
    assert report["builder_version"].startswith("0.18")
    names = {f["path"] for f in report["files"]}
    assert {"model.onnx", "model.onnx.data", "genai_config.json", "tokenizer.json", "chat_template.jinja",
            "generation_config.json"} <= names
    assert _output_errors(folder) == []
    assert matmulnbits_agreement(_load(folder), tiny_quark.quant_config) == []
    # staging and cache folders are gone
    assert [p.name for p in folder.parent.iterdir()] == ["oga"]


def test_the_builders_idle_int4_pass_is_skipped_and_the_files_are_the_same(oga_default, oga_quantized_head, tiny_quark, tmp_path, monkeypatch):
    """The builder's int4 pass copies the whole model into one proto (7 GiB at 8B) to quantize nothing when Quark's
    linears are MatMulNBits already and its exclusions stay float: skipped then (stages/export/nbits.py), run when
    the builder has a node to quantize (its own lm_head), and the export written with the pass run instead is the
    same bytes, file for file."""
    from raipack.stages.export import nbits
    from raipack.stages.export.builder import export

    assert oga_default[1]["builder_nbits_pass"] == "skipped"
    assert oga_quantized_head[1]["builder_nbits_pass"] == "ran"
    monkeypatch.setattr(nbits, "has_work", lambda model: True)
    ran = export(tiny_quark.quark_dir, tmp_path / "oga")
    assert ran["builder_nbits_pass"] == "ran"
    mine = {p.relative_to(oga_default[0]): p.read_bytes() for p in sorted(oga_default[0].rglob("*")) if p.is_file()}
    theirs = {p.relative_to(tmp_path / "oga"): p.read_bytes() for p in sorted((tmp_path / "oga").rglob("*")) if p.is_file()}
    assert mine.keys() == theirs.keys() and Path("model.onnx.data") in mine
    assert [name for name in mine if mine[name] != theirs[name]] == []
    from onnxruntime_genai.models import builder

    assert builder.Model.to_nbits.__qualname__.endswith("Model.to_nbits")  # the builder's own method is back


def test_builder_quantization_of_lm_head_is_caught(oga_quantized_head, tiny_quark):
    folder, report = oga_quantized_head
    model = _load(folder)
    assert "nodes_to_exclude" not in report["extra_options"]
    ops = _ops(model)
    assert ops["GatherBlockQuantized"] == 1
    head = [n for n in model.graph.node if n.name.startswith("/lm_head/")]
    assert head[0].op_type == "MatMulNBits"
    findings = matmulnbits_agreement(model, tiny_quark.quant_config)
    assert _pointers(findings) == {head[0].name, "/model/embed_tokens/GatherBlockQuantized"}
    assert any("Quark excluded lm_head" in f.message for f in findings)
    assert all(f.hint for f in findings)


def test_export_writes_only_into_a_new_or_empty_folder_and_rejects_non_quark(tiny_quark, tmp_path):
    """export() never replaces a folder (the build runner stages and swaps) and writes nothing beside it,
    its builder's scratch cache included."""
    from raipack.core.errors import RaipackError
    from raipack.stages.export.builder import export

    out = tmp_path / "oga"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    with pytest.raises(RaipackError, match="oga is not an empty folder"):
        export(tiny_quark.quark_dir, out, extra_options={"num_hidden_layers": 1})
    assert [p.name for p in out.iterdir()] == ["stale.txt"]
    (out / "stale.txt").unlink()
    report = export(tiny_quark.quark_dir, out, extra_options={"num_hidden_layers": 1})
    assert not list(out.glob(".*"))
    assert _genai(out)["model"]["decoder"]["num_hidden_layers"] == 1
    assert report["extra_options"]["num_hidden_layers"] == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["oga"]
    with pytest.raises(RaipackError, match="quant_method"):
        export(tiny_quark.fp_dir, tmp_path / "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["oga"]


def test_hybrid_profile_export_runs_with_position_ids(tiny_quark, tmp_path, oga_default):
    from raipack.runtime.ortloop import OrtDecoder
    from raipack.stages.export.builder import PROFILES, export

    out = tmp_path / "hybrid"
    export(tiny_quark.quark_dir, out, **PROFILES["hybrid"])
    assert _output_errors(out) == []
    assert matmulnbits_agreement(_load(out), tiny_quark.quant_config) == []
    dec = OrtDecoder(out)
    assert dec.has_position_ids
    ref = OrtDecoder(oga_default[0])
    ids = [5, 60, 70, 80, 90]
    cos = [float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(dec.logits(ids), ref.logits(ids))]
    assert min(cos) > 0.999


# --- contract checks -----------------------------------------------------------------------------


def test_io_contract_flags_renamed_input(oga_default):
    folder, _ = oga_default
    model, genai = _load(folder), _genai(folder)
    assert io_contract(model, genai) == []
    model.graph.input[1].name = "attn_mask"
    found = io_contract(model, genai)
    assert {"attention_mask", "attn_mask"} <= _pointers(found)


def test_io_contract_flags_missing_present_output(oga_default):
    folder, _ = oga_default
    model, genai = _load(folder), _genai(folder)
    keep = [o for o in model.graph.output if o.name != "present.1.value"]
    del model.graph.output[:]
    model.graph.output.extend(keep)
    found = io_contract(model, genai)
    assert _pointers(found) == {"present.1.value"}
    assert "layer 1" in found[0].message


def test_io_contract_flags_wrong_kv_heads_and_head_size(oga_default):
    folder, _ = oga_default
    model, genai = _load(folder), _genai(folder)
    bad = copy.deepcopy(genai)
    bad["model"]["decoder"]["num_key_value_heads"] = 4
    found = io_contract(model, bad)
    assert "past_key_values.0.key" in _pointers(found)
    assert "/model/layers.0/attn/GroupQueryAttention" in _pointers(found)
    bad = copy.deepcopy(genai)
    bad["model"]["decoder"]["head_size"] = 32
    assert any("head_size=32" in f.message for f in io_contract(model, bad))
    bad = copy.deepcopy(genai)
    bad["model"]["decoder"]["num_hidden_layers"] = 3
    assert "past_key_values.2.key" in _pointers(io_contract(model, bad))


def test_matmulnbits_agreement_flags_block_size_and_zero_points(oga_default, tiny_quark):
    folder, _ = oga_default
    model = _load(folder)
    assert matmulnbits_agreement(model, tiny_quark.quant_config) == []
    node = next(n for n in model.graph.node if n.name == "/model/layers.1/mlp/down_proj/MatMulNBits")
    next(a for a in node.attribute if a.name == "block_size").i = 32
    found = matmulnbits_agreement(model, tiny_quark.quant_config)
    assert _pointers(found) == {node.name}
    assert "block_size=32" in found[0].message and "group_size=128" in found[0].message
    del node.input[3]
    assert len(matmulnbits_agreement(model, tiny_quark.quant_config)) == 2


def test_matmulnbits_agreement_reads_layer_quant_config(oga_default, tiny_quark):
    model = _load(oga_default[0])
    qc = copy.deepcopy(tiny_quark.quant_config)
    qc["layer_quant_config"] = {"*.mlp.down_proj": {"weight": dict(qc["global_quant_config"]["weight"], group_size=64)}}
    found = matmulnbits_agreement(model, qc)
    assert _pointers(found) == {f"/model/layers.{i}/mlp/down_proj/MatMulNBits" for i in range(2)}
    qc = copy.deepcopy(tiny_quark.quant_config)
    qc["exclude"] = ["lm_head", "*.layers.0.mlp.*"]
    found = matmulnbits_agreement(model, qc)
    assert _pointers(found) == {f"/model/layers.0/mlp/{p}/MatMulNBits" for p in ("gate_proj", "up_proj", "down_proj")}


def test_external_data_refs(oga_default, tmp_path):
    folder, _ = oga_default
    model = _load(folder)
    assert external_data_refs(model, folder) == []
    size = (folder / "model.onnx.data").stat().st_size
    t = next(t for t in model.graph.initializer if t.name.endswith("down_proj.MatMulNBits.qweight"))
    entry = {e.key: e for e in t.external_data}
    entry["offset"].value = str(size - 10)
    found = external_data_refs(model, folder)
    assert _pointers(found) == {t.name} and str(size) in found[0].message
    entry["offset"].value = "0"
    entry["location"].value = "../model.onnx.data"
    assert "outside the model folder" in external_data_refs(model, folder)[0].message
    entry["location"].value = "/etc/passwd"
    assert "outside the model folder" in external_data_refs(model, folder)[0].message
    entry["location"].value = "missing.data"
    assert "does not exist" in external_data_refs(model, folder)[0].message
    entry["location"].value = "model.onnx.data"
    entry["length"].value = "7"
    assert "needs" in external_data_refs(model, folder)[0].message


def test_output_check_refuses_an_lfs_pointer_graph(oga_default, tmp_path):
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(oga_default[0], folder)
    assert _output_errors(folder) == []
    (folder / "model.onnx").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 1\n")
    assert any(f.path == "model.onnx" for f in _output_errors(folder))


def test_name_mapping_helpers():
    assert contract.hf_to_node("model.layers.3.self_attn.q_proj") == "/model/layers.3/attn/q_proj/MatMul"
    assert contract.hf_to_node("model.layers.0.mlp.down_proj") == "/model/layers.0/mlp/down_proj/MatMul"
    assert contract.hf_to_node("lm_head") == "/lm_head/MatMul"
    assert contract.hf_to_node("model.embed_tokens") is None
    assert contract.node_to_hf("/model/layers.2/attn/qkv_proj/MatMulNBits")[:3] == [
        "model.layers.2.self_attn.q_proj", "model.layers.2.self_attn.k_proj", "model.layers.2.self_attn.v_proj"]
    assert contract.node_to_hf("/lm_head/MatMul_Q4") == ["lm_head"]
    old = {"exclude": [], "global_quant_config": {"weight": {"dtype": "uint4", "group_size": 128, "symmetric": False}},
           "layer_quant_config": {"lm_head": {"weight": {"dtype": "uint4", "group_size": 32, "symmetric": False}}}}
    assert contract.layer_weight_spec(old, "lm_head")["group_size"] == 32
    assert contract.layer_weight_spec(old, "model.layers.0.mlp.up_proj")["group_size"] == 128
    assert contract.layer_weight_spec({**old, "exclude": ["*lm_head"]}, "lm_head") is None


# --- plain onnxruntime loop and parity -----------------------------------------------------------


def test_ortdecoder_matches_onnxruntime_genai(oga_default, tiny_quark):
    import onnxruntime_genai as og

    from raipack.runtime.ortloop import OrtDecoder

    folder, _ = oga_default
    dec = OrtDecoder(folder, threads=2)
    tok = og.Tokenizer(str(folder))
    model = og.Model(str(folder))
    for prompt in PROMPTS:
        ids = [int(i) for i in tok.encode(prompt)]
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + 24, do_sample=False)
        gen = og.Generator(model, params)
        gen.append_tokens(ids)
        oga_tokens, oga_logits = [], []
        while not gen.is_done():
            oga_logits.append(np.array(gen.get_logits())[0, -1].copy())
            gen.generate_next_token()
            oga_tokens.append(int(gen.get_next_tokens()[0]))
        mine, rows = dec.greedy(ids, 24, stop_at_eos=True)
        assert mine == oga_tokens
        assert np.array_equal(rows[0], oga_logits[0])
        assert dec.greedy(ids, 24, stop_at_eos=True, chunk_size=2)[0] == mine
    assert len(set(mine)) > 1  # the trained tiny model does not just repeat one token


def test_parity_with_transformers(oga_default, tiny_quark):
    from raipack.stages.export.parity import parity

    report = parity(tiny_quark.quark_dir, oga_default[0], PROMPTS, HELDOUT_TEXT, steps=32)
    assert report["greedy_identical"], [(p["tokens_onnx"], p["tokens_transformers"]) for p in report["prompts"]]
    assert report["cosine_min"] > 0.99
    assert report["matmulnbits_accuracy_levels"] == [1]
    assert report["dequantized_modules"] == 0  # Quark's linears dequantize per call (no float32 copy of them: 28 GB at 8B)
    assert 0 < report["seconds_load"] + report["seconds_onnx"] + report["seconds_transformers"] <= report["seconds"]
    assert report["fast_dequantized_modules"] == 2 * 7  # with raipack's reader of the packing (bit-identical, test_quantize.py)
    assert report["reference_loader"] == "raipack"  # AMD's scheme without Quark's import (raipack.runtime.quark_plain)
    assert all(len(p["tokens_onnx"]) == 32 for p in report["prompts"])
    assert [p["positions_compared"] for p in report["prompts"]] == [8] * len(PROMPTS) and report["positions_compared"] == 8 * len(PROMPTS)
    ppl = report["perplexity"]
    assert ppl["tokens"] > 20 and abs(ppl["ratio"] - 1) < 0.02
    json.dumps(report)
    # dequantized once instead (the option): the same linears swapped, the same verdict and tokens
    once = parity(tiny_quark.quark_dir, oga_default[0], PROMPTS, HELDOUT_TEXT, steps=32, dequantize_once=True)
    assert once["dequantized_modules"] == 2 * 7 and once["reference_loader"] == "quark"
    assert [p["tokens_transformers"] for p in once["prompts"]] == [p["tokens_transformers"] for p in report["prompts"]]
    assert abs(once["perplexity"]["transformers"] - ppl["transformers"]) < 1e-3 * ppl["transformers"]


def test_parity_reads_the_held_out_token_budget(oga_default, tiny_quark):
    """[export].parity_tokens reaches both perplexities: 16 tokens read where the default ("auto": the full budget at
    the tiny model's size, raipack.runtime.budget) reads more."""
    from raipack.runtime.budget import folder_budget
    from raipack.stages.export.parity import parity
    from raipack.stages.export.stage import ExportConfig

    small = parity(tiny_quark.quark_dir, oga_default[0], PROMPTS[:1], HELDOUT_TEXT, steps=4, max_heldout_tokens=16)
    default = folder_budget(tiny_quark.quark_dir, ExportConfig().parity_tokens)
    assert small["perplexity"]["tokens"] == 16 < default.tokens == 256 and default.basis.startswith("auto: ")


def test_parity_holds_one_model_at_a_time(oga_default, tiny_quark, monkeypatch):
    """Parity never holds the export's decoder and the Quark model in transformers together (at 8B each is several
    GiB beside the builder's leftovers): neither exists when the other is made; the check sees one kept alive."""
    import gc
    import weakref

    import transformers

    from raipack.runtime import ortloop
    from raipack.stages.export import parity as parity_module

    decoders: list = []
    models: list = []
    alive_at_load: list[int] = []  # decoders alive when transformers loads
    models_at_init: list[int] = []  # transformers models alive when a decoder is made
    real_init, real_load, real_plain = ortloop.OrtDecoder.__init__, transformers.AutoModelForCausalLM.from_pretrained, parity_module.load_plain

    def init(self, *args, **kwargs):
        gc.collect()
        models_at_init.append(sum(ref() is not None for ref in models))
        real_init(self, *args, **kwargs)
        decoders.append(weakref.ref(self))

    def load(*args, **kwargs):
        gc.collect()
        alive_at_load.append(sum(ref() is not None for ref in decoders))
        model = real_load(*args, **kwargs)
        models.append(weakref.ref(model))
        return model

    def plain(*args, **kwargs):  # the reference model without Quark (raipack.runtime.quark_plain), counted as a load too
        gc.collect()
        alive_at_load.append(sum(ref() is not None for ref in decoders))
        model = real_plain(*args, **kwargs)
        models.append(weakref.ref(model))
        return model

    monkeypatch.setattr(ortloop.OrtDecoder, "__init__", init)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", load)
    monkeypatch.setattr(parity_module, "load_plain", plain)
    report = parity_module.parity(tiny_quark.quark_dir, oga_default[0], PROMPTS[:1], HELDOUT_TEXT, steps=4, max_heldout_tokens=16)
    assert len(decoders) == 1 and alive_at_load == [0] and models_at_init == [0]
    assert report["perplexity"]["tokens"] == 16 and report["seconds_load"] > 0
    # a decoder or a model still referenced when the other is made is counted: the checks above can fail
    kept_model = load(tiny_quark.quark_dir)
    kept = ortloop.OrtDecoder(oga_default[0])
    load(tiny_quark.quark_dir)
    assert models_at_init[-1] == 1 and alive_at_load[-1] == 1
    del kept, kept_model


def test_one_packed_forward_gives_each_sequences_own_logits(tiny_quark):
    """Parity runs the prompts and the held-out text through transformers in one forward (each of Quark's
    linears dequantized once for all): packed with positions restarting at 0, each segment's rows are those
    of a forward of its own, and the order of the segments changes nothing."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from raipack.stages.export.parity import _hf_packed

    tok = AutoTokenizer.from_pretrained(str(tiny_quark.quark_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_quark.quark_dir), dtype=torch.float32).eval()
    seqs = [tok(PROMPTS[0])["input_ids"] + [5, 6, 7], tok(HELDOUT_TEXT)["input_ids"][:40], tok(PROMPTS[1])["input_ids"]]
    rows = [4, 40, 1]
    packed = _hf_packed(model, list(zip(seqs, rows)))
    with torch.no_grad():
        alone = [model(input_ids=torch.tensor([s]), use_cache=False).logits[0, -r:].numpy() for s, r in zip(seqs, rows)]
    assert [p.shape for p in packed] == [(r, model.config.vocab_size) for r in rows]
    for p, a in zip(packed, alone):
        assert np.abs(p - a).max() < 1e-4 and np.array_equal(p.argmax(-1), a.argmax(-1))
    # without the restarted positions the later segments would see the earlier ones: the check can fail
    with torch.no_grad():
        joined = model(input_ids=torch.tensor([seqs[0] + seqs[1]]), use_cache=False).logits[0, -40:].numpy()
    assert np.abs(joined - alone[1]).max() > 1e-2
    reordered = _hf_packed(model, list(zip(seqs[::-1], rows[::-1])))[::-1]
    assert all(np.abs(p - q).max() < 1e-4 for p, q in zip(packed, reordered))


def test_parity_finds_where_the_exports_tokens_leave_transformers_greedy(oga_default, tiny_quark, monkeypatch):
    """transformers is checked along the export's tokens from one forward: a token the export got wrong is
    where the two greedy decodings diverge, and transformers' own choice there is reported."""
    from raipack.runtime.ortloop import OrtDecoder
    from raipack.stages.export.parity import parity

    greedy = OrtDecoder.greedy

    def wrong_at_step_3(self, ids, steps, **kw):
        tokens, rows = greedy(self, ids, steps, **kw)
        tokens[3] = (tokens[3] + 1) % 512
        return tokens, rows

    monkeypatch.setattr(OrtDecoder, "greedy", wrong_at_step_3)
    report = parity(tiny_quark.quark_dir, oga_default[0], PROMPTS[:1], HELDOUT_TEXT, steps=12, positions=12)
    p = report["prompts"][0]
    assert not report["greedy_identical"] and p["first_divergence"] == 3 and p["positions_compared"] == 12
    assert p["tokens_transformers"][:3] == p["tokens_onnx"][:3] and len(p["tokens_transformers"]) == 4
    assert p["tokens_transformers"][3] == (p["tokens_onnx"][3] - 1) % 512  # the token the export had before it was changed


def test_parity_samples_the_first_the_last_and_seeded_positions():
    from raipack.stages.export.parity import sample_positions

    sample = sample_positions(32, 8)
    assert len(sample) == 8 and sample[0] == 0 and sample[-1] == 31 and sample == sorted(set(sample))
    assert sample_positions(32, 8) == sample and sample_positions(32, 8, seed=1) != sample  # fixed by its seed
    assert sample_positions(5, 8) == [0, 1, 2, 3, 4] and sample_positions(32, 2) == [0, 31]


@pytest.mark.parametrize("key, value", [("parity_positions", 1), ("parity_positions", "8"), ("parity_steps", 0), ("parity_tokens", 1)])
def test_a_bad_parity_setting_is_refused_in_one_sentence_naming_it(key, value):
    from raipack.core.errors import UsageError
    from raipack.stages.export.stage import ExportConfig, preflight

    with pytest.raises(UsageError, match=rf"^\[export\]\.{key} is {value!r}; expected a whole number of at least") as exc:
        preflight(ExportConfig(**{key: value}), {})
    assert exc.value.exit_code == 2 and key in exc.value.hint


def test_parity_positions_is_a_recipe_key_checked_by_the_schema(tmp_path, capsys):
    from raipack.builder.recipe import load
    from raipack.cli import main

    assert load(None, {"export.parity_positions": 4}).stages["export"] == {"parity_positions": 4}
    assert load(None, {"export.parity_tokens": 128}).stages["export"] == {"parity_tokens": 128}
    (tmp_path / "r.toml").write_text("[export]\nparity_positions = 1\n")
    with pytest.raises(SystemExit) as exc:
        main(["build", "--recipe", str(tmp_path / "r.toml"), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "r.toml: /export/parity_positions is 1; expected an integer of at least 2" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_excluded_nodes_follow_quark_patterns(tiny_quark):
    from raipack.stages.export.builder import excluded_nodes

    config = json.loads((tiny_quark.quark_dir / "config.json").read_text())
    qc = dict(tiny_quark.quant_config, exclude=["lm_head", "*.layers.1.mlp.down_proj"])
    assert excluded_nodes(tiny_quark.quark_dir, config, qc) == [
        "/lm_head/MatMul", "/model/layers.1/mlp/down_proj/MatMul", "/model/embed_tokens/Gather"]
    untied = dict(config, tie_word_embeddings=False)
    assert "/model/embed_tokens/Gather" not in excluded_nodes(tiny_quark.quark_dir, untied, qc)
