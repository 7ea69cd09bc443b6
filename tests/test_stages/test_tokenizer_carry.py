"""The export and the package carry the source's tokenizer files byte for byte (issue 14), as AMD's
packages do. The onnxruntime-genai builder re-saves the tokenizer through AutoTokenizer: for a Qwen2
model whose tokenizer lacks `<|endoftext|>`, Qwen2Tokenizer adds it as a 513th token (and the
builder rewrites model_max_length), so the export failed its own check with "tokenizer.json has 513
tokens, more than the model's vocabulary of 512". Here a tiny Qwen2-shaped model (vocab 512, tied
embeddings, q/k/v biases, rope theta 1e6; tokenizer without `<|endoftext|>`, with vocab.json and
merges.txt as Qwen's repositories have them) is built up to the fused package."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared_fixtures import CHAT_TEMPLATE

ROLES = ("tokenizer", "chat_template")
ONE_BUILD = pytest.mark.xdist_group("qwen2-tokenizer-carry")  # make test runs --dist loadgroup: the build is made once


def make_tiny_qwen2(out: Path) -> Path:
    """Random Qwen2 weights (nothing here depends on their quality) and a byte-level BPE tokenizer
    of exactly 512 tokens whose special tokens are <|im_start|> and <|im_end|> only."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from raipack.data import CALIBRATION_TEXT

    out.mkdir(parents=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([str(CALIBRATION_TEXT)], trainer)
    assert tok.get_vocab_size() == 512 and tok.token_to_id("<|endoftext|>") is None
    tok.save(str(out / "tokenizer.json"))
    tok.model.save(str(out))  # vocab.json, merges.txt
    im_end = tok.token_to_id("<|im_end|>")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>", "pad_token": None,
        "model_max_length": 131072, "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {str(tok.token_to_id(t)): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                                                           "normalized": False, "single_word": False} for t in ("<|im_start|>", "<|im_end|>")},
    }, indent=2) + "\n")
    cfg = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True,
                      bos_token_id=im_end, eos_token_id=im_end)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).eval().save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=im_end, eos_token_id=im_end, do_sample=False).save_pretrained(out)
    doc = json.loads((out / "config.json").read_text())  # the published form: rope_theta, not rope_parameters
    doc.pop("rope_parameters", None)
    doc.update(rope_theta=1e6, rope_scaling=None)
    (out / "config.json").write_text(json.dumps(doc, indent=2) + "\n")
    return out


def tokenizer_files(folder: Path) -> dict[str, bytes]:
    """name -> bytes of every tokenizer and chat template file of a folder (roles of pipeline/data/roles.json)."""
    from raipack.core.package import role_of

    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir()) if p.is_file() and role_of(p.name) in ROLES}


@pytest.fixture(scope="module")
def qwen2_build(tmp_path_factory):
    from raipack.builder.recipe import load
    from raipack.builder.runner import build

    root = tmp_path_factory.mktemp("qwen2-carry")
    model = make_tiny_qwen2(root / "Tiny-Qwen2")
    recipe = load(None, {"model": str(model), "profile": "1.8.0-npu-4K", "output": str(root / "build"),
                         "quantize.algorithm": "rtn", "quantize.num_samples": 2, "quantize.seq_len": 64, "quantize.quality": False,
                         "export.parity": False})
    return model, build(recipe, until="fuse", cache_root=root / "cache")


@ONE_BUILD
def test_export_and_package_carry_the_source_tokenizer_byte_for_byte(qwen2_build):
    model, result = qwen2_build
    source = tokenizer_files(model)
    assert {"tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"} <= set(source)
    export = next(s for s in result.stages if s.name == "export")
    assert tokenizer_files(export.path) == source  # the same files, the same bytes: nothing added, nothing rewritten
    assert tokenizer_files(result.package) == source
    carried = export.report["tokenizer"]
    assert sorted(carried["from_source"]) == sorted(source)
    assert "tokenizer.json" in carried["rewritten_by_builder"]  # what the builder did, put back
    assert "chat_template.jinja" in carried["removed"]  # the builder's copy of the template tokenizer_config.json holds


@ONE_BUILD
def test_genai_config_keeps_token_ids_inside_the_vocabulary(qwen2_build):
    model, result = qwen2_build
    src = json.loads((model / "config.json").read_text())
    for folder in (next(s for s in result.stages if s.name == "export").path, result.package):
        genai = json.loads((Path(folder) / "genai_config.json").read_text())["model"]
        assert genai["vocab_size"] == src["vocab_size"] == 512
        ids = [genai["bos_token_id"], genai["pad_token_id"], *([genai["eos_token_id"]] if isinstance(genai["eos_token_id"], int) else genai["eos_token_id"])]
        assert all(0 <= i < 512 for i in ids), ids


# --- the two steps on their own, on folders as the builder leaves them (no build) ---------------------


def write(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def test_carry_puts_back_the_source_files_and_drops_the_builders_extras(tmp_path):
    from raipack.stages.export.builder import carry_tokenizer

    src = write(tmp_path / "quark", {"tokenizer.json": '{"a": 1}', "tokenizer_config.json": '{"model_max_length": 1e30}',
                                     "additional_chat_templates/tool.jinja": "{{ x }}", "model.safetensors": "w"})
    out = write(tmp_path / "oga", {"tokenizer.json": '{"a": 1, "added": 513}', "tokenizer_config.json": '{"model_max_length": 32768}',
                                   "special_tokens_map.json": "{}", "chat_template.jinja": "t", "genai_config.json": "{}"})
    record = carry_tokenizer(src, out)
    assert tokenizer_files(out) == tokenizer_files(src)
    assert (out / "additional_chat_templates" / "tool.jinja").read_text() == "{{ x }}"
    assert record["rewritten_by_builder"] == ["tokenizer.json", "tokenizer_config.json"]
    assert record["removed"] == ["chat_template.jinja", "special_tokens_map.json"] and record["converted_by_builder"] == []
    assert sorted(p.name for p in out.iterdir()) == ["additional_chat_templates", "genai_config.json", "tokenizer.json", "tokenizer_config.json"]


def test_a_sentencepiece_source_keeps_the_builders_tokenizer_json(tmp_path):
    """The runtimes read tokenizer.json; a source with only tokenizer.model gets the builder's conversion."""
    from raipack.stages.export.builder import carry_tokenizer

    src = write(tmp_path / "quark", {"tokenizer.model": "spm", "tokenizer_config.json": '{"legacy": true}'})
    out = write(tmp_path / "oga", {"tokenizer.json": "{}", "tokenizer_config.json": '{"legacy": false}', "tokenizer.model": "spm"})
    record = carry_tokenizer(src, out)
    assert (out / "tokenizer_config.json").read_text() == '{"legacy": true}' and (out / "tokenizer.json").read_text() == "{}"
    assert record["converted_by_builder"] == ["tokenizer.json"] and record["removed"] == []
    assert record["rewritten_by_builder"] == ["tokenizer_config.json"]


def test_genai_config_ids_beyond_the_vocabulary_are_fixed_there(tmp_path):
    from raipack.stages.export.builder import fit_token_ids

    out = write(tmp_path / "oga", {"genai_config.json": json.dumps({"model": {"vocab_size": 512, "bos_token_id": 1, "eos_token_id": [7, 512], "pad_token_id": 512}})})
    assert fit_token_ids(out) == {"eos_token_id": [[7, 512], [7]], "pad_token_id": [512, 7]}
    model = json.loads((out / "genai_config.json").read_text())["model"]
    assert (model["eos_token_id"], model["pad_token_id"], model["bos_token_id"]) == ([7], 7, 1)
    before = (out / "genai_config.json").read_bytes()
    assert fit_token_ids(out) == {} and (out / "genai_config.json").read_bytes() == before  # inside: untouched
