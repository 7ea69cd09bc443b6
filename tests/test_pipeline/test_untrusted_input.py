"""Untrusted inputs: validation and build never run a package's code or unpickle its weights."""

from __future__ import annotations

import json
import os
import pickle
import time

import numpy as np
import pytest

from factory import write_safetensors
from raipack.builder.inputs import check_model_dir
from raipack.core.errors import UsageError
from raipack.validate import validate


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
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
LFS_POINTER = f"version https://git-lfs.github.com/spec/v1\noid sha256:{'ab' * 32}\nsize 16777216\n"
ESCAPE = "{{ cycler.__init__.__globals__.os.popen('touch MARKER').read() }}"  # build-3 of the fuzz harness


class Link(str):
    """A file of model_folder() that is a symlink to this target."""


FIFO = object()  # a file of model_folder() that is a named pipe


def tokenizer_json(**changes) -> str:
    """A tokenizer.json the tokenizers library loads: 250 tokens, <|im_end|> added as id 250."""
    from tokenizers import Tokenizer, models

    doc = json.loads(Tokenizer(models.BPE(vocab={f"t{i}": i for i in range(250)}, merges=[], unk_token="t0")).to_str())
    doc["added_tokens"] = [{"id": 250, "content": "<|im_end|>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}]
    return json.dumps({**doc, **changes})


def model_folder(tmp_path, config_text=None, **files):
    """A folder that passes the input check, with `config_text` and `files` (name -> text, bytes,
    a Link, FIFO, or None to delete it) replacing its own."""
    d = tmp_path / "model"
    d.mkdir()
    write_safetensors(d / "model.safetensors", {"w": np.zeros((2, 2), np.float32)})
    base = {"config.json": config_text or json.dumps(GOOD_CONFIG), "tokenizer.json": tokenizer_json(),
            "tokenizer_config.json": json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "chat_template": CHAT_TEMPLATE}),
            "generation_config.json": json.dumps({"bos_token_id": 1, "eos_token_id": [2, 250]})}
    for name, content in {**base, **files}.items():
        path = d / name
        if os.path.lexists(path):
            path.unlink()
        if content is FIFO:
            os.mkfifo(path)
        elif isinstance(content, Link):
            path.symlink_to(content)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            path.write_text(content)
    return d


def safetensors_bytes(tensors: dict, data_size: int) -> bytes:
    header = json.dumps(tensors).encode()
    return len(header).to_bytes(8, "little") + header + bytes(data_size)


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
    # issue 11, fuzz cases build-3, -9, -17, -31, -37, -40 and their neighbours
    ("chat template leaves the sandbox", {"tokenizer_config.json": json.dumps({"chat_template": ESCAPE})}, ["tokenizer_config.json", "chat_template", "__globals__"]),
    ("chat_template.jinja leaves the sandbox", {"chat_template.jinja": "{{ messages[0]['__class__'] }}"}, ["chat_template.jinja", "'__class__'"]),
    ("chat template attr() with a built name", {"chat_template.jinja": "{{ (cycler | attr('__in' ~ 'it__'))('x') }}"}, ["chat_template.jinja", "sandbox", "SecurityError"]),
    ("chat template range 10**9", {"chat_template.jinja": "{% for x in range(10**9) %}{% endfor %}"}, ["chat_template.jinja", "sandbox", "OverflowError"]),
    ("chat template syntax error", {"chat_template.jinja": "{% for m in messages %}"}, ["chat_template.jinja", "not a valid Jinja template"]),
    ("chat_template a number", {"tokenizer_config.json": json.dumps({"chat_template": 5})}, ["tokenizer_config.json", "chat_template", "5"]),
    ("model.safetensors links to /dev/zero", {"model.safetensors": Link("/dev/zero")}, ["model.safetensors", "leaves the model folder", "/dev/zero"]),
    ("README.md links outside", {"README.md": Link("/etc/passwd")}, ["README.md", "leaves the model folder"]),
    ("README.md links to itself", {"README.md": Link("README.md")}, ["README.md", "symlink loop"]),
    ("README.md links to a folder inside", {"README.md": Link(".")}, ["README.md", "a folder"]),
    ("README.md a FIFO", {"README.md": FIFO}, ["README.md", "FIFO"]),
    ("config.json initializer_range a string", {"config_text": config(initializer_range="0.02")}, ["config.json", "initializer_range"]),
    ("config.json tie_word_embeddings a string", {"config_text": config(tie_word_embeddings="no")}, ["config.json", "tie_word_embeddings"]),
    ("config.json unknown model_type", {"config_text": config(model_type="llamaX")}, ["config.json", "model_type", "llamaX"]),
    ("model.safetensors an LFS pointer", {"model.safetensors": LFS_POINTER}, ["model.safetensors", "Git LFS pointer", "git lfs pull"]),
    ("tokenizer.json an LFS pointer", {"tokenizer.json": LFS_POINTER}, ["tokenizer.json", "Git LFS pointer"]),
    ("safetensors shorter than 8 bytes", {"model.safetensors": b"\x10\x00"}, ["model.safetensors", "too short"]),
    ("safetensors header length beyond the file", {"model.safetensors": (1 << 40).to_bytes(8, "little") + b"{}"}, ["model.safetensors", "header length"]),
    ("safetensors header not JSON", {"model.safetensors": (4).to_bytes(8, "little") + b"{abc"}, ["model.safetensors", "not valid JSON"]),
    ("safetensors tensor past the data", {"model.safetensors": safetensors_bytes({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 32]}}, 16)},
     ["model.safetensors", "'w'", "data_offsets"]),
    ("safetensors shape and bytes disagree", {"model.safetensors": safetensors_bytes({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]}}, 16)},
     ["model.safetensors", "'w'", "24 bytes"]),
    ("safetensors unknown dtype", {"model.safetensors": safetensors_bytes({"w": {"dtype": "F31", "shape": [4], "data_offsets": [0, 16]}}, 16)},
     ["model.safetensors", "dtype", "'F31'"]),
    ("safetensors tensors overlap", {"model.safetensors": safetensors_bytes({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                                                            "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, 16)},
     ["model.safetensors", "'b'", "overlap"]),
    ("safetensors trailing bytes", {"model.safetensors": safetensors_bytes({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, 16)},
     ["model.safetensors", "16 bytes of tensor data"]),
    ("safetensors index names a missing shard", {"model.safetensors.index.json": json.dumps({"weight_map": {"w": "model-00002-of-00002.safetensors"}})},
     ["model.safetensors.index.json", "weight_map", "model-00002-of-00002.safetensors"]),
    ("safetensors index names a file outside", {"model.safetensors.index.json": json.dumps({"weight_map": {"w": "../outside.safetensors"}})},
     ["model.safetensors.index.json", "'../outside.safetensors'"]),
    ("tokenizer.json deleted", {"tokenizer.json": None}, ["has no tokenizer", "tokenizer.json"]),
    ("tokenizer.json not a tokenizer", {"tokenizer.json": json.dumps({"model": {"type": "Nope"}})}, ["tokenizer.json", "tokenizers library"]),
    ("tokenizer.json merges outside the vocabulary", {"tokenizer.json": tokenizer_json(model={"type": "BPE", "vocab": {"a": 0}, "merges": [["q", "r"]]})},
     ["tokenizer.json", "tokenizers library", "`q`"]),
    ("tokenizer_config.json bos_token a number", {"tokenizer_config.json": json.dumps({"bos_token": 5})}, ["tokenizer_config.json", "cannot be loaded", "bos_token"]),
    ("generation_config.json bos_token_id a string", {"generation_config.json": json.dumps({"bos_token_id": "1"})}, ["generation_config.json", "bos_token_id", "'1'"]),
    ("generation_config.json eos_token_id beyond vocab_size", {"generation_config.json": json.dumps({"eos_token_id": [2, 999]})},
     ["generation_config.json", "eos_token_id", "vocab_size 256"]),
    ("generation_config.json nested 900 deep", {"generation_config.json": json.dumps({"transformers_version": json.loads("[" * 900 + "]" * 900)})},
     ["generation_config.json", "nested too deeply"]),
    ("generation_config.json repetition_penalty a string", {"generation_config.json": json.dumps({"repetition_penalty": "x"})},
     ["generation_config.json", "repetition_penalty", "a number"]),
    ("generation_config.json max_new_tokens 0", {"generation_config.json": json.dumps({"max_new_tokens": 0})},
     ["generation_config.json", "GenerationConfig", "max_new_tokens"]),
    ("config.json with a byte order mark", {"config_text": "\ufeff" + config()}, ["config.json", "byte order mark"]),
    ("config.json pad_token_id beyond vocab_size", {"config_text": config(pad_token_id=256)}, ["config.json", "pad_token_id", "vocab_size 256"]),
    ("generation_config.json bos_token_id negative", {"generation_config.json": json.dumps({"bos_token_id": -2})}, ["generation_config.json", "bos_token_id", "-2"]),
]


def build_cli(capsys, monkeypatch, tmp_path, model):
    from raipack.cli import main

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


def test_the_base_model_folder_passes(tmp_path, transformers_loaded):
    model = model_folder(tmp_path)
    t0 = time.perf_counter()
    assert check_model_dir(model) == model
    assert time.perf_counter() - t0 < 1, "the input check of a small folder, transformers imported, takes < 1 s"


@pytest.fixture(scope="module")
def transformers_loaded():
    """The input check's last steps import transformers (seconds, once per process): imported
    here, so each case's time is the check's own."""
    from transformers import AutoTokenizer  # noqa: F401
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    CONFIG_MAPPING["llama"]


@pytest.mark.parametrize("files, names", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_build_refuses_a_bad_model_folder_before_any_stage(tmp_path, capsys, monkeypatch, transformers_loaded, files, names):
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


@pytest.mark.parametrize("template", [
    "{{ cycler.__init__.__globals__.os.popen('touch MARKER').read() }}",  # seen in the template's text
    "{{ ((cycler | attr('__in' ~ 'it__')) | attr('__glo' ~ 'bals__')).os.popen('touch MARKER').read() }}",  # only at render time
])
def test_a_chat_template_leaving_the_sandbox_is_refused_without_running(tmp_path, capsys, monkeypatch, transformers_loaded, template):
    marker = tmp_path / "template-ran"
    model = model_folder(tmp_path, **{"chat_template.jinja": template.replace("MARKER", str(marker))})
    code, err, _ = build_cli(capsys, monkeypatch, tmp_path, model)
    assert code == 2 and "chat_template.jinja" in err and "Traceback" not in err, err
    assert not marker.exists()
    assert_nothing_written(tmp_path)


def test_symlinks_to_files_inside_the_folder_are_followed(tmp_path, transformers_loaded):
    model = model_folder(tmp_path, **{"docs.txt": "notes", "README.md": Link("docs.txt")})
    (model / "sub").mkdir()
    (model / "sub" / "link.txt").symlink_to("../docs.txt")
    assert check_model_dir(model) == model


def hub_snapshot(tmp_path, link_outside=None):
    """A Hugging Face hub cache folder: every file of the snapshot a link to ../../blobs/<hash>."""
    src = model_folder(tmp_path)
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, f in enumerate(sorted(src.iterdir())):
        f.rename(blobs / f"{i:040x}")
        (snapshot / f.name).symlink_to(f"../../blobs/{i:040x}")
    if link_outside:
        (snapshot / "README.md").symlink_to(link_outside)
    return snapshot


def test_a_hub_cache_snapshot_links_into_its_blobs(tmp_path, transformers_loaded):
    snapshot = hub_snapshot(tmp_path)
    assert check_model_dir(snapshot) == snapshot


def test_a_hub_cache_snapshot_linking_elsewhere_is_refused(tmp_path):
    (tmp_path / "secret.txt").write_text("key")
    snapshot = hub_snapshot(tmp_path, link_outside=tmp_path / "secret.txt")
    with pytest.raises(UsageError, match="README.md is a symlink that leaves the model folder"):
        check_model_dir(snapshot)


# --------------------------------------------------------------------------- the last resort: a stage's exception

def crashing_quantize(monkeypatch, exc: BaseException):
    """The quantize stage, its run replaced by one raising `exc`."""
    import dataclasses

    from raipack.builder import stages

    real = stages.get

    def boom(job):
        raise exc

    monkeypatch.setattr(stages, "get", lambda name: dataclasses.replace(real(name), run=boom) if name == "quantize" else real(name))


def test_an_unexpected_exception_in_a_stage_is_one_sentence_and_a_traceback_file(tmp_path, capsys, monkeypatch, transformers_loaded):
    crashing_quantize(monkeypatch, TypeError("new(): invalid data type 'str'\nsecond line"))
    code, err, _ = build_cli(capsys, monkeypatch, tmp_path, model_folder(tmp_path))
    message, _, hint = err.partition("\n  hint: ")
    assert code == 1 and "Traceback" not in err, err
    assert message.strip() == "ERROR: stage quantize failed on model: TypeError: new(): invalid data type 'str'", err
    saved = tmp_path / "out" / "model_rai_1.8.0_npu_16K.stages" / "quantize.traceback.txt"
    assert str(saved) in hint and "raipack bug" in hint, hint
    assert "Traceback (most recent call last)" in saved.read_text() and "second line" in saved.read_text()
    assert not list((tmp_path / "out").rglob("manifest.json")) and not list((tmp_path / "cache").rglob(".staging-*"))


def test_memory_error_in_a_stage_is_a_sentence_about_memory(tmp_path, capsys, monkeypatch, transformers_loaded):
    crashing_quantize(monkeypatch, MemoryError())
    code, err, _ = build_cli(capsys, monkeypatch, tmp_path, model_folder(tmp_path))
    assert code == 1 and "stage quantize ran out of memory on model" in err and "Traceback" not in err, err


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_interrupt_and_exit_in_a_stage_pass_through(tmp_path, monkeypatch, transformers_loaded, exc):
    from raipack.builder.recipe import load
    from raipack.builder.runner import build

    crashing_quantize(monkeypatch, exc())
    recipe = load(None, {"model": str(model_folder(tmp_path)), "output": str(tmp_path / "out")})
    with pytest.raises(exc):
        build(recipe, until="quantize", cache_root=tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob(".staging-*")) and not list((tmp_path / "out").rglob("*.traceback.txt"))
