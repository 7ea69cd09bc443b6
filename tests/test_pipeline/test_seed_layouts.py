"""The seed packages at their real dimensions, without their weights (issue 7).

Each of the five packages the project started from is generated with its real model's config
(layers, heads, KV heads, head size, vocabulary, rope settings), its profile's bucket files and
sparse weight files of the real sizes, then validated: the cross-file rules hold at 8B scale. A
second package per seed breaks one cross-file fact and must fail.
"""

from __future__ import annotations

import json

import pytest

from factory import params, real_size_package, write_json
from raipack.npu.genai import ryzenai_options
from raipack.validate import validate
from seed_models import FAMILIES, PACKAGES

GiB = 1024**3


def seed_package(root, name: str):
    return real_size_package(root, name, PACKAGES[name])


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_seed_package_layout_validates_at_real_size(tmp_path, name):
    pkg = seed_package(tmp_path, name)
    family = FAMILIES[PACKAGES[name]["family"]]["config"]
    n = params(PACKAGES[name]["family"])
    assert n > 3e9 and (pkg / "model.bin").stat().st_size > 0.45 * n > GiB  # real-sized (sparse): about half a byte per weight
    result = validate(pkg)
    assert result.profile == PACKAGES[name]["profile"], result.profile_reason
    assert "folder name" in result.profile_reason
    assert [f for f in result.findings if f.severity in ("error", "warning")] == []
    genai = json.loads((pkg / "genai_config.json").read_text())
    dec = genai["model"]["decoder"]
    assert (dec["num_hidden_layers"], dec["num_key_value_heads"], genai["model"]["vocab_size"]) == (
        family["num_hidden_layers"], family["num_key_value_heads"], family["vocab_size"])
    if family["model_type"] == "phi3":
        assert "phi3 settings" in result.profile_reason
    opts, _ = ryzenai_options(genai)
    assert opts["hybrid_opt_token_backend"] == "npu"


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_seed_package_with_a_broken_cross_file_fact_fails(tmp_path, name):
    """The same package with genai_config.json's KV head count off by a factor of two."""
    pkg = seed_package(tmp_path, name)
    genai = json.loads((pkg / "genai_config.json").read_text())
    genai["model"]["decoder"]["num_key_value_heads"] //= 2
    write_json(pkg / "genai_config.json", genai)
    errors = [f for f in validate(pkg).findings if f.severity == "error"]
    assert errors and any("key" in f.message.lower() and "head" in f.message.lower() for f in errors), errors


HYBRID = {"Llama-3.2-3B-Instruct_rai_1.8.0_hybrid": {"family": "llama-3.2-3b", "profile": "1.8.0-hybrid"}}  # one: ~5 s at real size


@pytest.mark.parametrize("name", sorted(HYBRID))
def test_amd_hybrid_package_validates_at_real_size(tmp_path, name):
    """AMD's hybrid layout (model_jit.*, no tiers, the 1.7 hybrid RyzenAI options, config.json {}) at a
    real model's size: clean, detected by its folder name."""
    pkg = real_size_package(tmp_path, name, HYBRID[name])
    assert (pkg / "model_jit.bin").stat().st_size > GiB and json.loads((pkg / "config.json").read_text()) == {}
    result = validate(pkg)
    assert result.profile == HYBRID[name]["profile"] and "folder name" in result.profile_reason
    assert [f for f in result.findings if f.severity in ("error", "warning")] == []
    opts, _ = ryzenai_options(json.loads((pkg / "genai_config.json").read_text()))
    assert opts == {"external_data_file": "model_jit.pb.bin", "hybrid_opt_free_after_prefill": "1", "hybrid_opt_max_seq_length": "4096"}
