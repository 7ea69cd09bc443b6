"""Fixtures for the export-stage tests (imported by test_export.py; tests/stages/conftest.py is
owned by the quantize tests).

A tiny Llama (2 layers, hidden 256, intermediate 512, 4 heads / 2 KV heads, tied embeddings like
SmolLM2) with a byte-level BPE tokenizer trained on the text below, trained for a few dozen steps so
its next-token distributions are peaked (greedy comparisons are then meaningful), quantized with Quark
RTN `uint4_wo_128` with lm_head excluded, and exported with Quark's own `export_safetensors`.
Nothing is downloaded.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_SENTENCES = [
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "A neural processing unit runs matrix multiplications with low power.",
    "Quantization stores each weight in four bits with a scale and a zero point.",
    "The model builder writes a graph, its external data and a configuration file.",
    "Every layer keeps a key and value cache that grows by one token per step.",
    "Rome is the capital of Italy, and Madrid is the capital of Spain.",
    "Small models are fast to test, while large models need patient engineers.",
    "The tokenizer splits text into bytes and merges frequent pairs into tokens.",
    "Greedy decoding always picks the token with the highest logit.",
]
TRAIN_TEXT = "\n".join(" ".join(_SENTENCES[i:] + _SENTENCES[:i]) for i in range(len(_SENTENCES)))
HELDOUT_TEXT = (
    "Berlin is the capital of Germany. The lazy dog sleeps near the river. A four bit weight has a "
    "scale and a zero point. The cache grows by one token per step, and greedy decoding picks the best token."
)
PROMPTS = ["Paris is the capital of", "The model builder writes", "Quantization stores each"]


@dataclass
class TinyQuark:
    fp_dir: Path
    quark_dir: Path
    quant_config: dict
    tied: bool


def _tokenizer(out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TRAIN_TEXT], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
        unk_token="<|endoftext|>", pad_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def build_tiny_quark(root: Path, *, tied: bool = True, train_steps: int = 40) -> TinyQuark:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    fp_dir, quark_dir = root / "fp", root / "quark"
    fp_dir.mkdir(parents=True)
    tok = _tokenizer(fp_dir)
    cfg = LlamaConfig(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    ids = torch.tensor(tok(TRAIN_TEXT)["input_ids"])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(train_steps):
        starts = torch.randint(0, ids.numel() - 65, (8,))
        batch = torch.stack([ids[s : s + 64] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    model.save_pretrained(fp_dir)
    GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id).save_pretrained(fp_dir)

    from quark.torch import LLMTemplate, ModelQuantizer, export_safetensors

    qcfg = LLMTemplate.get("llama").get_config(scheme="uint4_wo_128", algorithm=None, exclude_layers=["lm_head"])
    quantizer = ModelQuantizer(qcfg)
    with torch.no_grad():
        model = quantizer.quantize_model(model, [ids[None, :128]])
        model = quantizer.freeze(model)
    export_safetensors(model, str(quark_dir), custom_mode="quark", weight_format="real_quantized", pack_method="reorder")
    tok.save_pretrained(quark_dir)
    GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id).save_pretrained(quark_dir)
    qc = json.loads((quark_dir / "config.json").read_text())["quantization_config"]
    return TinyQuark(fp_dir, quark_dir, qc, tied)


def _load_tiny(root: Path) -> TinyQuark:
    qc = json.loads((root / "quark" / "config.json").read_text())["quantization_config"]
    return TinyQuark(root / "fp", root / "quark", qc, True)


@pytest.fixture(scope="session")
def tiny_quark(tmp_path_factory) -> TinyQuark:
    """A Quark export (uint4, group 128, asymmetric, lm_head excluded) of a tied tiny Llama.

    Under pytest-xdist the workers share one build (the first builds it under a file lock in the
    run's common temp folder, the others reuse it), so the Quark run is paid once per test run.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return build_tiny_quark(tmp_path_factory.mktemp("export-tiny"))
    import fcntl

    root = tmp_path_factory.getbasetemp().parent / "export-tiny-shared"
    with open(str(root) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "done").exists():
            if root.exists():
                import shutil

                shutil.rmtree(root)
            build_tiny_quark(root)
            (root / "done").write_text("ok")
    return _load_tiny(root)


@pytest.fixture(scope="session")
def oga_default(tiny_quark, tmp_path_factory):
    """(folder, report) of export() with the defaults: int4, cpu, Quark's exclusions kept float."""
    from stages.export.builder import export

    out = tmp_path_factory.mktemp("oga-default") / "oga"
    return out, export(tiny_quark.quark_dir, out)


@pytest.fixture(scope="session")
def oga_quantized_head(tiny_quark, tmp_path_factory):
    """(folder, report) of export(keep_excluded_float=False): the builder's own lm_head quantization."""
    from stages.export.builder import export

    out = tmp_path_factory.mktemp("oga-qhead") / "oga"
    return out, export(tiny_quark.quark_dir, out, keep_excluded_float=False)
