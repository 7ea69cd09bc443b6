"""An oracle for the sliding window that does not come from the pipeline itself.

The smoke stage compares the fused package with the unfused export, which cannot catch a window both
lack. Here the export of a tiny Mistral v0.1 (window 192, every layer sliding) is compared with the
transformers model itself, both in float32: a prompt well past the window must give the same logits at
every position and the same greedy tokens. The same export with its attention's `local_window_size`
set back to -1 (what the builder wrote before stages/export/mistral.py) must fail that comparison past
the window and only there.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from seed_models import make_tiny_model, tiny_config

FAMILY = "mistral-7b-v0.1"
PROMPT = 300  # tokens: past the tiny window of 192, inside one 512 prefill
NEW = 8  # greedy tokens after the prompt
ATOL = 1e-4  # float32 export vs float32 transformers (measured: 1.4e-6); the window's absence costs far more (asserted)


def fp32_export(src: Path, out: Path) -> Path:
    """The builder's float32 CPU export of `src` with raipack's family fixes, as the export stage runs it."""
    from onnxruntime_genai.models.builder import create_model, parse_extra_options

    from stages.export.families import extra_options, patched_builder

    kv = [f"{k}={v}" for k, v in extra_options(tiny_config(FAMILY)["model_type"]).items()]
    parsed = parse_extra_options(None, str(src), str(out), "fp32", "cpu", str(out / ".cache"), kv)
    with patched_builder():
        create_model(None, str(src), str(out), "fp32", "cpu", str(out / ".cache"), **parsed)
    shutil.rmtree(out / ".cache", ignore_errors=True)
    return out


def attention_windows(folder: Path) -> list[int]:
    import onnx

    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    return [a.i for n in model.graph.node if n.op_type == "GroupQueryAttention" for a in n.attribute if a.name == "local_window_size"]


def without_window(folder: Path, out: Path) -> Path:
    """A copy of the export whose attention attends to every past token (local_window_size -1)."""
    import onnx

    shutil.copytree(folder, out)
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    for node in model.graph.node:
        for a in node.attribute:
            if node.op_type == "GroupQueryAttention" and a.name == "local_window_size":
                a.i = -1
    onnx.save(model, str(out / "model.onnx"))
    return out


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    """(HF model folder, its float32 export, token ids of a prompt past the window)."""
    root = tmp_path_factory.mktemp("sliding-window")
    src = make_tiny_model(FAMILY, root / "hf", train_steps=0)  # random weights: logits compared, not text
    ids = np.random.default_rng(0).integers(3, tiny_config(FAMILY)["vocab_size"], PROMPT).tolist()
    return src, fp32_export(src, root / "export"), ids


def transformers_run(src: Path, ids: list[int]):
    """(logits [len(ids), vocab] of the prompt, greedy tokens after it) from transformers in float32."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].numpy()
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, min_new_tokens=NEW)
    return logits, out[0, len(ids):].tolist()


def export_run(folder: Path, ids: list[int]):
    from pipeline.runtime.ortloop import OrtDecoder

    dec = OrtDecoder(folder, threads=2)
    tokens, _ = dec.greedy(ids, NEW)
    return dec.logits(ids), tokens


def test_the_export_keeps_the_window_transformers_applies(mistral, tmp_path):
    src, export, ids = mistral
    window = tiny_config(FAMILY)["sliding_window"]
    assert attention_windows(export) == [window] * tiny_config(FAMILY)["num_hidden_layers"]

    want, want_tokens = transformers_run(src, ids)
    got, tokens = export_run(export, ids)
    diff = np.abs(got - want).max(axis=-1)
    assert diff.max() < ATOL, f"export vs transformers: max |logit diff| {diff.max():.2e} at position {int(diff.argmax())}"
    assert tokens == want_tokens

    old, _ = export_run(without_window(export, tmp_path / "old"), ids)
    old_diff = np.abs(old - want).max(axis=-1)
    assert old_diff[:window].max() < ATOL  # identical while the prompt fits the window...
    assert old_diff[window:].min() > 100 * ATOL  # ...and wrong at every position past it (measured: from 0.035)
