"""`raipack build` refuses what it cannot build up front (issue 14): mixture-of-experts models,
multimodal wrappers and architectures that need their own Python code get one sentence naming the
architecture, why, and the supported ones — from config.json alone, before any weight is opened,
with exit code 2 and no output folder, cache or staging folder left behind."""

from __future__ import annotations

import io
import json
import os

import pytest

from raipack.cli import main
from raipack.data import load_data
from raipack.npu import families

SUPPORTED = families.supported()
GLM_AUTO_MAP = {"AutoConfig": "configuration_chatglm.ChatGLMConfig", "AutoModel": "modeling_chatglm.ChatGLMForConditionalGeneration"}

# (architectures[0], what config.json holds besides it, the reason the sentence must give, the clue it must quote or None)
CASES = {
    "gpt-oss": ("GptOssForCausalLM", {"model_type": "gpt_oss", "num_local_experts": 32}, "mixture-of-experts", "num_local_experts is 32"),
    "mixtral": ("MixtralForCausalLM", {"model_type": "mixtral", "num_local_experts": 8}, "mixture-of-experts", "num_local_experts is 8"),
    "qwen-moe": ("Qwen2MoeForCausalLM", {"model_type": "qwen2_moe", "num_experts": 60}, "mixture-of-experts", "num_experts is 60"),
    "deepseek-v3": ("DeepseekV3ForCausalLM", {"model_type": "deepseek_v3", "n_routed_experts": 256}, "mixture-of-experts", "n_routed_experts is 256"),
    "unknown-moe": ("FutureMoeForCausalLM", {"model_type": "future_moe", "n_routed_experts": 64}, "mixture-of-experts", "n_routed_experts is 64"),
    "gemma3-mm": ("Gemma3ForConditionalGeneration", {"model_type": "gemma3", "vision_config": {"model_type": "siglip_vision_model"},
                                                      "text_config": {"model_type": "gemma3_text"}}, "multimodal", "vision_config in config.json"),
    "llava": ("LlavaForConditionalGeneration", {"model_type": "llava", "vision_config": {}, "image_token_index": 32000}, "multimodal", "image_token_index is 32000"),
    "qwen2-vl": ("Qwen2VLForConditionalGeneration", {"model_type": "qwen2_vl", "vision_config": {"depth": 32}}, "multimodal", "vision_config in config.json"),
    "phi4-mm": ("Phi4MMForCausalLM", {"model_type": "phi4mm", "auto_map": {"AutoModelForCausalLM": "modeling_phi4mm.Phi4MMForCausalLM"}}, "multimodal", None),
    "unknown-nested-moe": ("FutureForCausalLM", {"model_type": "future", "text_config": {"num_local_experts": 16}}, "mixture-of-experts",
                           "text_config.num_local_experts is 16"),
    "unknown-mm": ("FutureForConditionalGeneration", {"model_type": "future", "audio_config": {"n_mels": 128}}, "multimodal", "audio_config in config.json"),
    "chatglm3": ("ChatGLMModel", {"model_type": "chatglm", "auto_map": GLM_AUTO_MAP}, "needs its own Python code", "auto_map in config.json"),
    "unknown-remote": ("FutureLMHeadModel", {"model_type": "future", "auto_map": GLM_AUTO_MAP}, "needs its own Python code", "auto_map in config.json"),
}


def config_only_folder(root, arch: str, fields: dict):
    """A model folder with config.json and a garbage model.safetensors (larger than a Git LFS pointer,
    so not even its first bytes are sniffed): parsing it would be refused with another sentence."""
    folder = root / "model"
    folder.mkdir()
    doc = {"architectures": [arch], "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 512, **fields}
    (folder / "config.json").write_text(json.dumps(doc))
    weights = folder / "model.safetensors"
    weights.write_bytes(b"\xff" * 8 + os.urandom(4096))
    (folder / "modeling_chatglm.py").write_text(f"open({str(root / 'imported')!r}, 'w')\n")  # run, it would leave a marker
    return folder, weights


def guard_weights(monkeypatch, weights):
    """Any open of the weights file fails the test, whichever way it is opened."""
    real_os_open, real_io_open = os.open, io.open

    def refuse(path):
        if os.path.abspath(os.fspath(path)) == str(weights):
            raise AssertionError(f"{weights} was opened")

    def os_open(path, *a, **kw):
        if not isinstance(path, int):
            refuse(path)
        return real_os_open(path, *a, **kw)

    def io_open(file, *a, **kw):
        if not isinstance(file, int):
            refuse(file)
        return real_io_open(file, *a, **kw)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(io, "open", io_open)
    monkeypatch.setattr("builtins.open", io_open)


def build(capsys, *args):
    with pytest.raises(SystemExit) as info:
        main(["build", *map(str, args)])
    out, err = capsys.readouterr()
    return info.value.code, out, err


@pytest.mark.parametrize("trust", [False, True], ids=["plain", "trust-remote-code"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_unsupported_model_is_refused_from_its_config(case, trust, tmp_path, capsys, monkeypatch):
    arch, fields, reason, clue = CASES[case]
    model, weights = config_only_folder(tmp_path, arch, fields)
    cache, out = tmp_path / "cache", tmp_path / "out"
    monkeypatch.setenv("RAIPACK_CACHE", str(cache))
    guard_weights(monkeypatch, weights.resolve())

    code, _, err = build(capsys, model, "--output", out, *(["--trust-remote-code"] if trust else []))

    errors = [line for line in err.splitlines() if line.startswith("ERROR: ")]
    assert code == 2 and len(errors) == 1, err
    sentence = errors[0]
    assert f"{model / 'config.json'}: architectures is ['{arch}']" in sentence
    assert reason in sentence and all(name in sentence for name in SUPPORTED)
    assert clue is None or f"({clue})" in sentence
    assert "--trust-remote-code" in sentence if reason == "needs its own Python code" else True
    assert sentence.count(". ") == 0 and "  hint: " in err  # one sentence, then the hint
    assert not out.exists() and not cache.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no staging, no marker of imported code
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "model.safetensors", "modeling_chatglm.py"]


def test_unknown_dense_architecture_names_the_supported_ones(tmp_path, capsys, monkeypatch):
    """No kind known and no clue in the config: the sentence still names it and the supported ones."""
    model, weights = config_only_folder(tmp_path, "MambaForCausalLM", {"model_type": "mamba", "num_experts": 1})
    monkeypatch.setenv("RAIPACK_CACHE", str(tmp_path / "cache"))
    guard_weights(monkeypatch, weights.resolve())
    code, _, err = build(capsys, model, "--output", tmp_path / "out")
    assert code == 2
    assert "architectures is ['MambaForCausalLM'], which raipack does not build; it builds " + ", ".join(SUPPORTED) in err
    assert "mixture" not in err and not (tmp_path / "out").exists()


def test_every_refused_name_has_a_known_kind():
    data = load_data("architectures.json")
    assert set(data["refused"].values()) <= set(data["kinds"])
    assert not set(data["refused"]) & set(SUPPORTED)
