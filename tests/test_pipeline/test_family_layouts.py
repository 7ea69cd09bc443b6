"""Issue 14's family packages at their real dimensions, without their weights.

Each AMD NPU package of tests/data/families.json (`packages`: Qwen2.5, the DeepSeek-R1 distills,
Qwen3, Mistral v0.1 and v0.3, Phi-4-mini, Gemma 3, Llama-2, CodeLlama) is generated under its AMD
folder name with the real checkpoint's config (layers, heads, KV heads, explicit head_dim, vocabulary,
rope settings, sliding window), its profile's bucket files and sparse weight files of the real sizes,
like the seed layouts (test_seed_layouts.py). It must validate clean and be detected as its profile
by its folder name; the same package with one cross-file fact of its family broken must fail with
the check that owns that fact.
"""

from __future__ import annotations

import json

import pytest

from factory import params, real_size_package, write_json
from raipack.validate import validate
from seed_models import FAMILIES, FAMILY_PACKAGES


def edit(path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    write_json(path, doc)


def decoder(doc: dict) -> dict:
    return doc["model"]["decoder"]


def tokenizer_padded(pkg):
    """Qwen2's tokenizer re-saved through AutoTokenizer, which adds a pad token past the vocabulary (issue 14)."""
    def add(doc):
        doc["added_tokens"].append({"id": FAMILIES[FAMILY_PACKAGES[pkg.name]["family"]]["config"]["vocab_size"], "content": "<|pad|>", "special": True,
                                    "single_word": False, "lstrip": False, "rstrip": False, "normalized": False})
    edit(pkg / "tokenizer.json", add)


def qwen_7b_sizes(pkg):
    """genai_config.json of DeepSeek-R1-Distill-Qwen-7B (28 heads, 4 KV heads, hidden 3584) beside the 1.5B's config."""
    edit(pkg / "genai_config.json", lambda doc: decoder(doc).update(num_attention_heads=28, num_key_value_heads=4, hidden_size=3584))


def head_size_from_hidden(pkg):
    """Qwen3 states head_dim (128) explicitly; a genai_config.json written with another head size."""
    edit(pkg / "genai_config.json", lambda doc: decoder(doc).update(head_size=64))


def window_dropped_from_config(pkg):
    """Mistral v0.2/v0.3's config.json (no sliding window) beside v0.1's genai_config.json (4096)."""
    edit(pkg / "config.json", lambda doc: doc.update(sliding_window=None))


def vocab_of(other_vocab: int):
    def fault(pkg):
        edit(pkg / "genai_config.json", lambda doc: doc["model"].update(vocab_size=other_vocab))
    fault.__doc__ = f"genai_config.json's vocab_size {other_vocab}, another variant's"
    return fault


def full_rotary_factors(pkg):
    """Phi-4-mini rotates 96 of 128 head dimensions: LongRoPE factors for a full rotary (64) do not fit."""
    edit(pkg / "config.json", lambda doc: doc["rope_scaling"].update(long_factor=[1.0] * 64, short_factor=[1.0] * 64))


def every_layer_sliding(pkg):
    """Gemma 3's 5 local : 1 global pattern lost: every layer listed as a sliding-window layer."""
    edit(pkg / "genai_config.json", lambda doc: decoder(doc)["sliding_window"].update(layers=list(range(decoder(doc)["num_hidden_layers"]))))


def window_of_1b(pkg):
    """gemma-3-4b's window is 1024; genai_config.json with the 1b's 512."""
    edit(pkg / "genai_config.json", lambda doc: decoder(doc)["sliding_window"].update(window_size=512))


def qwen_token_ids(pkg):
    """DeepSeek-R1-Distill-Llama-8B with the Qwen distill's special token ids (151646...), past Llama's 128256."""
    edit(pkg / "genai_config.json", lambda doc: doc["model"].update(bos_token_id=151646, eos_token_id=151643, pad_token_id=151643))


FAULTS = {  # family → (fault, the check that must fail it)
    "qwen2.5-1.5b": (tokenizer_padded, "RP502"),
    "deepseek-r1-distill-qwen-1.5b": (qwen_7b_sizes, "RP502"),
    "qwen3-1.7b": (head_size_from_hidden, "RP502"),
    "mistral-7b-v0.1": (window_dropped_from_config, "RP504"),
    "mistral-7b-v0.3": (vocab_of(32000), "RP502"),
    "phi-4-mini": (full_rotary_factors, "RP505"),
    "gemma-3-1b": (every_layer_sliding, "RP504"),
    "gemma-3-4b": (window_of_1b, "RP504"),
    "llama-2-7b": (vocab_of(128256), "RP502"),
    "codellama-7b": (vocab_of(32000), "RP502"),
    "deepseek-r1-distill-llama-8b": (qwen_token_ids, "RP503"),
}
NAMES = sorted(FAMILY_PACKAGES)


def test_every_family_has_a_fault():
    assert {spec["family"] for spec in FAMILY_PACKAGES.values()} == set(FAULTS)


@pytest.mark.parametrize("name", NAMES)
def test_family_package_layout_validates_at_real_size_and_its_family_fault_fails(tmp_path, name):
    """One package per case, validated clean, then with its family's fault (FAULTS) validated again."""
    spec = FAMILY_PACKAGES[name]
    pkg = real_size_package(tmp_path, name, spec)
    config = FAMILIES[spec["family"]]["config"]
    n = params(spec["family"])
    weights = (pkg / "model.bin").stat().st_size + (pkg / "model.onnx.data").stat().st_size  # NPU uint4 + the CPU-side embedding
    assert weights > 0.45 * n > 0.4e9  # real-sized (sparse): at least half a byte per weight
    result = validate(pkg)
    assert result.profile == spec["profile"] and "folder name" in result.profile_reason, result.profile_reason
    assert [(f.check_id, f.message) for f in result.findings if f.severity in ("error", "warning")] == []
    genai = json.loads((pkg / "genai_config.json").read_text())
    dec = decoder(genai)
    head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    assert (dec["num_hidden_layers"], dec["num_key_value_heads"], dec["head_size"], dec["hidden_size"], genai["model"]["vocab_size"]) == (
        config["num_hidden_layers"], config["num_key_value_heads"], head, config["hidden_size"], config["vocab_size"])
    window = dec.get("sliding_window")
    if spec["family"].startswith(("gemma-3", "mistral-7b-v0.1")):  # the windowed families carry the window the runtime must honour
        assert window["window_size"] == config["sliding_window"]
        pattern = config.get("sliding_window_pattern")
        assert len(window["layers"]) == (config["num_hidden_layers"] - config["num_hidden_layers"] // pattern if pattern else config["num_hidden_layers"])
    else:
        assert window is None

    fault, check_id = FAULTS[spec["family"]]
    fault(pkg)
    errors = [f for f in validate(pkg).findings if f.severity == "error"]
    assert check_id in {f.check_id for f in errors}, (fault.__doc__, [(f.check_id, f.message) for f in errors])


@pytest.mark.parametrize(("name", "layers", "fails"), [
    ("Phi-4-mini-instruct_rai_1.8.0_npu_4K", [], False),  # the OGA builder's block for Phi-4-mini's 262144 window: no window in effect
    ("Mistral-7B-v0.1_rai_1.8.0_npu_4K", [], True),  # its block for Mistral v0.1 (no layer_types): the window on no layer, config.json's on all
])
def test_a_window_block_on_no_layer_is_held_to_the_config(tmp_path, name, layers, fails):
    spec = FAMILY_PACKAGES[name]
    pkg = real_size_package(tmp_path, name, spec)
    window = FAMILIES[spec["family"]]["config"]["sliding_window"]
    edit(pkg / "genai_config.json", lambda doc: decoder(doc).update(sliding_window={"window_size": window, "slide_key_value_cache": False, "slide_inputs": False, "layers": layers}))
    found = [f for f in validate(pkg).findings if f.check_id == "RP504"]
    assert bool(found) == fails, found
    if fails:
        assert "lists [] as sliding-window layers" in found[0].message and "[0, 1, 2" in found[0].message
