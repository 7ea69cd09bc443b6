"""Untrusted inputs: validation and build never run a package's code or unpickle its weights."""

from __future__ import annotations

import json
import os
import pickle
import time

import pytest

import numpy as np

from factory import write_safetensors
from pipeline.errors import UsageError
from pipeline.inputs import check_model_dir
from pipeline.validate import validate


class Boom:
    """Unpickling this runs os.system-like code: here it writes a marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def booby_trap(folder, marker_dir):
    (folder / "modeling_evil.py").write_text(f"open({str(marker_dir / 'imported')!r}, 'w').write('pwned')\n")
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(Boom(str(marker_dir / "unpickled"))))


def test_validate_never_runs_package_code(make_pkg, tmp_path):
    pkg = make_pkg("1.8.0-npu-16K")
    booby_trap(pkg, tmp_path)
    result = validate(pkg)
    assert not (tmp_path / "imported").exists() and not (tmp_path / "unpickled").exists()
    warned = {(f.check_id, f.path) for f in result.findings}
    assert ("RP105", "pytorch_model.bin") in warned and ("RP106", "modeling_evil.py") in warned


def hf_dir(tmp_path, **cfg):
    d = tmp_path / "model"
    d.mkdir()
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2}
    (d / "config.json").write_text(json.dumps({**base, **cfg}))
    return d


def test_build_input_with_remote_code_is_refused_without_running_it(tmp_path):
    d = hf_dir(tmp_path, auto_map={"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"})
    write_safetensors(d / "model.safetensors", {"w": np.zeros((2, 2), np.float32)})
    booby_trap(d, tmp_path)
    with pytest.raises(UsageError, match="auto_map") as info:
        check_model_dir(d)
    assert "--trust-remote-code" in info.value.hint
    assert not (tmp_path / "imported").exists() and not (tmp_path / "unpickled").exists()


def test_pickle_only_model_is_refused(tmp_path):
    d = hf_dir(tmp_path)
    booby_trap(d, tmp_path)
    with pytest.raises(UsageError, match="only pickle checkpoints"):
        check_model_dir(d)
    assert not (tmp_path / "unpickled").exists()


def test_unsupported_architecture_is_one_sentence(tmp_path):
    d = hf_dir(tmp_path, architectures=["MambaForCausalLM"])
    write_safetensors(d / "model.safetensors", {"w": np.zeros((2, 2), np.float32)})
    with pytest.raises(UsageError) as info:
        check_model_dir(d)
    assert "MambaForCausalLM" in str(info.value) and "LlamaForCausalLM" in str(info.value) and "\n" not in str(info.value)


def test_missing_input_is_one_sentence(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        check_model_dir(tmp_path / "nope")
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        check_model_dir(tmp_path / "f.txt")


# --------------------------------------------------------------------------- build's input check (issue 11)
# Each bad model folder is refused by `raipack build` before any stage runs: one sentence naming
# the file and the field, a hint, exit code 2, nothing in the output folder or the cache.

GOOD_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
               "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256, "head_dim": 16,
               "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
SIZES = ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "intermediate_size", "vocab_size", "head_dim")
DEEP = 100_000


def model_folder(tmp_path, config_text=None, **files):
    """A folder that passes the input check, with `config_text` and `files` (name -> text) replacing its own."""
    d = tmp_path / "model"
    d.mkdir()
    write_safetensors(d / "model.safetensors", {"w": np.zeros((2, 2), np.float32)})
    vocab = {f"t{i}": i for i in range(250)}
    tokenizer = {"model": {"type": "BPE", "vocab": vocab, "merges": []}, "added_tokens": [{"id": 255, "content": "<|im_end|>"}]}
    base = {"config.json": config_text or json.dumps(GOOD_CONFIG), "tokenizer.json": json.dumps(tokenizer),
            "tokenizer_config.json": json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"})}
    for name, text in {**base, **files}.items():
        (d / name).write_text(text)
    return d


def config(**changes):
    return json.dumps({**GOOD_CONFIG, **changes})


def raw_eps(text):  # JSON writers refuse these; a hand-edited file holds them
    return config(rms_norm_eps="EPS").replace('"EPS"', text)


BAD = [  # (id, files, names in the sentence)
    ("architectures int", {"config_text": config(architectures=5)}, ["config.json", "architectures"]),
    ("architectures dict", {"config_text": config(architectures={"LlamaForCausalLM": 1})}, ["config.json", "architectures"]),
    ("architectures empty", {"config_text": config(architectures=[])}, ["config.json", "architectures"]),
    ("nested 100000 deep", {"config_text": config()[:-1] + ', "x": ' + "[" * DEEP + "]" * DEEP + "}"}, ["config.json", "nested too deeply"]),
    *[(f"{key} {value!r}", {"config_text": config(**{key: value})}, ["config.json", key])
      for key in SIZES for value in (64.0, "64", -64, 0, True)],
    ("heads not a multiple of kv heads", {"config_text": config(num_key_value_heads=3)}, ["config.json", "num_key_value_heads"]),
    ("model_type int", {"config_text": config(model_type=7)}, ["config.json", "model_type"]),
    *[(f"rms_norm_eps {text}", {"config_text": raw_eps(text)}, ["config.json", "rms_norm_eps"]) for text in ("NaN", "Infinity", "-Infinity", "1e999")],
    ("rms_norm_eps string", {"config_text": config(rms_norm_eps="1e-5")}, ["config.json", "rms_norm_eps"]),
    ("rms_norm_eps negative", {"config_text": config(rms_norm_eps=-1e-5)}, ["config.json", "rms_norm_eps"]),
    ("added token beyond vocab_size", {"tokenizer.json": json.dumps({"model": {"vocab": {"a": 0}}, "added_tokens": [{"id": 256, "content": "<x>"}]})},
     ["tokenizer.json", "added_tokens", "256", "vocab_size 256"]),
    ("vocab token beyond vocab_size", {"tokenizer.json": json.dumps({"model": {"vocab": {"a": 0, "zz": 300}}, "added_tokens": []})},
     ["tokenizer.json", "model.vocab", "'zz'", "300"]),
    ("unigram vocab beyond vocab_size", {"tokenizer.json": json.dumps({"model": {"type": "Unigram", "vocab": [["a", 0.0]] * 257}})},
     ["tokenizer.json", "model.vocab", "256"]),
    ("token id a string", {"tokenizer.json": json.dumps({"model": {"vocab": {"a": "0"}}})}, ["tokenizer.json", "model.vocab", "'0'"]),
    ("added_tokens.json beyond vocab_size", {"added_tokens.json": json.dumps({"<x>": 999})}, ["added_tokens.json", "999"]),
    ("added_tokens_decoder beyond vocab_size", {"tokenizer_config.json": json.dumps({"added_tokens_decoder": {"4096": {"content": "<x>"}}})},
     ["tokenizer_config.json", "added_tokens_decoder", "4096"]),
    ("tokenizer.json nested 100000 deep", {"tokenizer.json": "[" * DEEP + "]" * DEEP}, ["tokenizer.json", "nested too deeply"]),
    ("tokenizer_config.json NaN", {"tokenizer_config.json": '{"model_max_length": NaN}'}, ["tokenizer_config.json", "model_max_length"]),
]


def build_cli(capsys, monkeypatch, tmp_path, model):
    from pipeline.cli import main

    monkeypatch.setenv("RAIPACK_CACHE", str(tmp_path / "cache"))
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as info:
        main(["build", str(model), "--output", str(tmp_path / "out"), "--until", "quantize", "--quiet"])
    seconds = time.perf_counter() - t0
    _, err = capsys.readouterr()
    return info.value.code, err, seconds


def assert_nothing_written(tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    assert not out.exists() or not any(out.rglob("*")), sorted(out.rglob("*"))
    assert not cache.exists(), sorted(cache.rglob("*"))


def test_the_base_model_folder_passes(tmp_path):
    model = model_folder(tmp_path)
    assert check_model_dir(model) == model


@pytest.mark.parametrize("files, names", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_build_refuses_a_bad_model_folder_before_any_stage(tmp_path, capsys, monkeypatch, files, names):
    model = model_folder(tmp_path, **files)
    code, err, seconds = build_cli(capsys, monkeypatch, tmp_path, model)
    message, _, hint = err.partition("\n  hint: ")
    assert code == 2, err
    assert message.startswith("ERROR: ") and "\n" not in message.strip() and hint.strip(), err
    assert "Traceback" not in err
    for name in names:
        assert name in message, (name, message)
    assert seconds < 5, f"the input check took {seconds:.2f} s"
    assert_nothing_written(tmp_path)


def test_tokenizer_auto_map_is_refused_without_running_it(tmp_path, capsys, monkeypatch):
    model = model_folder(tmp_path, **{"tokenizer_config.json": json.dumps({"auto_map": {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}})})
    (model / "tokenization_evil.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').write('pwned')\n")
    code, err, _ = build_cli(capsys, monkeypatch, tmp_path, model)
    assert code == 2 and "tokenizer_config.json has auto_map" in err and "--trust-remote-code" in err
    assert not (tmp_path / "imported").exists()
    assert_nothing_written(tmp_path)


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_a_special_file_is_refused_without_reading_it(tmp_path, name):
    model = model_folder(tmp_path)
    (model / name).unlink()
    os.mkfifo(model / name)  # reading it would block forever
    t0 = time.perf_counter()
    with pytest.raises(UsageError, match="not a regular file"):
        check_model_dir(model)
    assert time.perf_counter() - t0 < 5
