"""raipack.runtime.quark_plain: a Quark export of AMD's NPU scheme as a plain transformers model, without Quark's
import (the export's parity paid about 3 s of its 17 s at Llama-3.2-1B for it, issue 41 session 16). Held against
the model transformers loads through Quark with raipack's reader (parity's path before): the same logits bit for bit; and anything it does not read gives None,
so parity loads through Quark instead, never a model with a tensor misplaced or left uninitialized."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from raipack.npu.quark_config import plain_group_size
from raipack.runtime.quark_plain import load_plain
from shared_fixtures import HELDOUT_TEXT, PROMPTS


def _ids(folder: Path):
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    return torch.tensor([tok(PROMPTS[0] + " " + HELDOUT_TEXT)["input_ids"][:48]])


def test_the_plain_model_gives_quarks_logits_bit_for_bit(tiny_quark):
    import torch
    from transformers import AutoModelForCausalLM

    from raipack.runtime.quark_hf import fast_dequantize
    from raipack.stages.quark_import import import_quark

    ids = _ids(tiny_quark.quark_dir)
    plain = load_plain(tiny_quark.quark_dir)
    assert plain is not None and sum(type(m).__name__ == "PackedLinear" for m in plain.modules()) == 2 * 7
    import_quark()
    theirs = AutoModelForCausalLM.from_pretrained(str(tiny_quark.quark_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        quark_logits = theirs(input_ids=ids).logits
        assert fast_dequantize(theirs)["modules"] == 2 * 7  # parity's Quark path: the same reader inside Quark's modules
        fast_logits = theirs(input_ids=ids).logits
        mine = plain(input_ids=ids).logits
    assert torch.equal(mine, fast_logits)  # parity's Quark path, bit for bit
    assert torch.allclose(mine, quark_logits, rtol=0, atol=1e-5)  # Quark's unpacking: the same weights in another layout (test_quantize.py)
    assert plain.lm_head.weight is plain.model.embed_tokens.weight if tiny_quark.tied else True


def test_it_loads_without_importing_quark(tiny_quark):
    """In a fresh interpreter: the model loads and runs, and no module of Quark's was imported."""
    code = ("import sys, torch; from raipack.runtime.quark_plain import load_plain; "
            f"m = load_plain({str(tiny_quark.quark_dir)!r}); assert m is not None; "
            "m(input_ids=torch.tensor([[1, 2, 3]])); print(sorted(n for n in sys.modules if n == 'quark' or n.startswith('quark.')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("change", [
    {"export": {"pack_method": "order"}},
    {"global_quant_config": {"weight": {"dtype": "int4"}}},
    {"global_quant_config": {"weight": {"qscheme": "per_channel"}}},
    {"global_quant_config": {"weight": {"group_size": True}}},
    {"global_quant_config": {"input_tensors": {"dtype": "int8"}}},
    {"layer_quant_config": {"*down_proj": {}}},
    {"quant_method": "awq"},
])
def test_a_config_it_does_not_read_is_left_to_quark(tiny_quark, change):
    qc = json.loads(json.dumps(tiny_quark.quant_config))
    assert plain_group_size(qc) == qc["global_quant_config"]["weight"]["group_size"] > 0  # the export as Quark wrote it is read

    def merge(into: dict, patch: dict) -> None:
        for key, value in patch.items():
            if isinstance(value, dict) and value and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value

    merge(qc, change)
    assert plain_group_size(qc) is None


def _copy(tiny_quark, tmp_path: Path) -> Path:
    out = tmp_path / "quark"
    shutil.copytree(tiny_quark.quark_dir, out)
    return out


@pytest.mark.parametrize("edit", ["extra tensor", "missing norm", "scale of another shape", "config says int4", "unknown architecture"])
def test_tensors_it_cannot_place_give_none_and_parity_goes_through_quark(tiny_quark, oga_default, tmp_path, edit):
    from safetensors.torch import load_file, save_file

    from raipack.stages.export.parity import parity

    folder = _copy(tiny_quark, tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    down = next(k for k in tensors if k.endswith("down_proj.weight_scale"))
    if edit == "extra tensor":
        tensors[down.replace("weight_scale", "input_scale")] = tensors[down][:1].clone()
    elif edit == "missing norm":
        del tensors[next(k for k in tensors if k.endswith("input_layernorm.weight"))]
    elif edit == "scale of another shape":
        tensors[down] = tensors[down][:, :-1].contiguous()
    else:
        cfg = json.loads((folder / "config.json").read_text())
        if edit == "config says int4":
            cfg["quantization_config"]["global_quant_config"]["weight"]["dtype"] = "int4"
        else:  # transformers does not know it: None, not an exception (the Quark path reports it in its words)
            cfg["model_type"] = "not_a_transformers_model"
        (folder / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    assert load_plain(folder) is None
    if edit == "extra tensor":  # Quark itself reads the folder: parity falls back to it and still reaches a verdict
        report = parity(folder, oga_default[0], PROMPTS[:1], HELDOUT_TEXT, steps=4, max_heldout_tokens=16)
        assert report["reference_loader"] == "quark" and report["greedy_identical"]
