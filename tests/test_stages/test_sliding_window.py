"""An oracle for the sliding window that does not come from the pipeline itself.

The smoke stage compares the fused package with the unfused export, which cannot catch a window both
lack. Here the builder's export of a tiny Mistral v0.1 (window 192 on every layer) and of a tiny Gemma 3
(window 192 on 5 local layers, 1 global) is compared with the transformers model itself, both in
float32: a prompt well past the window must give the same logits at every position and the same greedy
tokens. The same export with its attention's `local_window_size` set back to -1 (what the builder wrote
for Mistral before stages/export/mistral.py) must fail that comparison past the window and only there.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from seed_models import make_tiny_model, tiny_config

FAMILIES = ["mistral-7b-v0.1", "gemma-3-4b"]
PROMPT = 300  # tokens: past the tiny window of 192, inside one 512 prefill
NEW = 8  # greedy tokens after the prompt
ATOL = 1e-4  # float32 export vs float32 transformers (measured: 1.4e-6); the window's absence costs far more (asserted)


def fp32_export(family: str, src: Path, out: Path) -> Path:
    """The builder's float32 CPU export of `src` with raipack's family fixes, as the export stage runs it."""
    from onnxruntime_genai.models.builder import create_model, parse_extra_options

    from raipack.stages.export.families import extra_options, patched_builder

    kv = [f"{k}={v}" for k, v in extra_options(tiny_config(family)["model_type"]).items()]
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


def expected_windows(src: Path) -> list[int]:
    """local_window_size per layer as transformers masks them: the window on sliding layers, else -1
    (a config with a window and no layer_types, as Mistral v0.1's, slides on every layer)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(src))
    types = getattr(config, "layer_types", None) or ["sliding_attention"] * config.num_hidden_layers
    return [config.sliding_window if t == "sliding_attention" else -1 for t in types]


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
    from raipack.runtime.ortloop import OrtDecoder

    dec = OrtDecoder(folder, threads=2)
    tokens, _ = dec.greedy(ids, NEW)
    return dec.logits(ids), tokens


@pytest.mark.parametrize("family", FAMILIES)
def test_the_export_keeps_the_window_transformers_applies(family, tmp_path):
    src = make_tiny_model(family, tmp_path / "hf", train_steps=0)  # random weights: logits compared, not text
    export = fp32_export(family, src, tmp_path / "export")
    ids = np.random.default_rng(0).integers(3, tiny_config(family)["vocab_size"], PROMPT).tolist()
    window = tiny_config(family)["sliding_window"]
    assert window < PROMPT and attention_windows(export) == expected_windows(src) and window in expected_windows(src)

    want, want_tokens = transformers_run(src, ids)
    got, tokens = export_run(export, ids)
    diff = np.abs(got - want).max(axis=-1)
    assert diff.max() < ATOL, f"export vs transformers: max |logit diff| {diff.max():.2e} at position {int(diff.argmax())}"
    assert tokens == want_tokens

    old, _ = export_run(without_window(export, tmp_path / "old"), ids)
    old_diff = np.abs(old - want).max(axis=-1)
    assert old_diff[:window].max() < ATOL  # identical while the prompt fits the window...
    assert old_diff[window:].min() > 100 * ATOL  # ...and wrong at every position past it (measured: from 0.035)
