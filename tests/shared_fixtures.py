"""The tests' shared fixtures, loaded once for the whole suite by tests/conftest.py (`pytest_plugins`).

- real packages: `reference_dir`, `reference_packages`, `make_pkg` (built by tests/factory.py);
- a tiny random Llama with a byte-level BPE tokenizer: `tiny_llama`, `tiny_tokenizer`;
- a tiny trained Llama quantized by Quark (RTN `uint4_wo_128`, lm_head excluded) and exported with
  Quark's own `export_safetensors`: `tiny_quark`; its OGA exports: `oga_default`, `oga_quantized_head`.

Nothing is downloaded: the tokenizers are trained in about a second, on the bundled calibration corpus
or on TRAIN_TEXT. Session fixtures that take long are built once per test run and shared by the
pytest-xdist workers through a file lock in the run's common temp folder.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from factory import REFERENCE_DIR_ENV, make_package, reference_key, reference_package
from helpers import build_once
from tiers import refuse_in_quick_tier

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


# ------------------------------------------------------------------------------ real packages


@pytest.fixture(autouse=True)
def _isolated_environment():
    """Each test gets the process environment back as it found it: stages tune it in-process (the
    quantize stage sets glibc allocator and OpenMP variables for its children), which would otherwise
    leak into every later test of the worker and the subprocesses they start."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session", autouse=True)
def reference_dir(tmp_path_factory):
    """Where factory.reference_package() builds the real reference packages, on first use: one folder
    per test run and content, shared by the pytest-xdist workers (the first builds, under a file lock)
    and, through the environment, by the subprocesses tests start."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "reference-packages" / reference_key()
    old = os.environ.get(REFERENCE_DIR_ENV)
    os.environ[REFERENCE_DIR_ENV] = str(folder)
    yield folder
    if old is None:
        os.environ.pop(REFERENCE_DIR_ENV, None)
    else:
        os.environ[REFERENCE_DIR_ENV] = old


@pytest.fixture(scope="session")
def reference_packages(reference_dir):
    """profile id -> the real fused package of every reference profile (read-only), built now: for
    tests that time a build and must not pay for this one inside it."""
    from raipack.npu.profile import all_profiles

    return {pid: reference_package(pid) for pid, p in all_profiles().items() if p.target == "reference"}


@pytest.fixture
def make_pkg(tmp_path):
    """make_pkg(profile_id, **kw) -> a fresh package folder that validates clean (a reference
    profile's is a copy of a real fused package)."""
    counter = iter(range(1000))

    def make(profile_id: str, **kw):
        return make_package(tmp_path / f"p{next(counter)}", profile_id, **kw)

    return make


# ------------------------------------------------------------------------------ tiny models


def train_bpe_tokenizer(out_dir: Path, vocab_size: int = 512, text: str | None = None):
    """A byte-level BPE tokenizer (OGA rejects WordLevel ones) trained on `text`, else on the bundled
    calibration corpus, saved with save_pretrained."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    if text is None:
        from raipack.data import CALIBRATION_TEXT

        tok.train([str(CALIBRATION_TEXT)], trainer)
    else:
        tok.train_from_iterator([text], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def make_tiny_llama(out_dir: Path, *, hidden: int = 256, intermediate: int = 512, layers: int = 2) -> Path:
    """A random Llama (4 heads, 2 KV heads, untied head) with a tokenizer trained on the calibration corpus."""
    refuse_in_quick_tier("make_tiny_llama (tests/shared_fixtures.py)")
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = train_bpe_tokenizer(out_dir)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id).save_pretrained(out_dir)
    # a file Quark does not know about, to prove extra files are carried over
    (out_dir / "README.md").write_text("tiny test model\n")
    return out_dir


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """Path of a saved tiny random Llama (read-only: copy it before changing it)."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "model")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_llama):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_llama))


# ------------------------------------------------------------------------------ tiny Quark export


@dataclass
class TinyQuark:
    fp_dir: Path
    quark_dir: Path
    quant_config: dict
    tied: bool


def build_tiny_quark(root: Path, *, tied: bool = True, train_steps: int = 40) -> TinyQuark:
    """A tiny Llama (2 layers, hidden 256, intermediate 512, 4 heads / 2 KV heads, tied embeddings like
    SmolLM2) trained for a few dozen steps on TRAIN_TEXT so its next-token distributions are peaked
    (greedy comparisons are then meaningful), quantized by Quark and exported: root/fp, root/quark."""
    refuse_in_quick_tier("build_tiny_quark (tests/shared_fixtures.py)")
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    fp_dir, quark_dir = root / "fp", root / "quark"
    fp_dir.mkdir(parents=True)
    tok = train_bpe_tokenizer(fp_dir, text=TRAIN_TEXT)
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
    for _ in range(train_steps):
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
    return _load_tiny(build_once(tmp_path_factory.getbasetemp().parent / "export-tiny-shared", build_tiny_quark))


@pytest.fixture(scope="session")
def oga_default(tiny_quark, tmp_path_factory):
    """(folder, report) of export() with the defaults: int4, cpu, Quark's exclusions kept float."""
    from raipack.stages.export.builder import export

    out = tmp_path_factory.mktemp("oga-default") / "oga"
    return out, export(tiny_quark.quark_dir, out)


@pytest.fixture(scope="session")
def oga_quantized_head(tiny_quark, tmp_path_factory):
    """(folder, report) of export(keep_excluded_float=False): the builder's own lm_head quantization."""
    from raipack.stages.export.builder import export

    out = tmp_path_factory.mktemp("oga-qhead") / "oga"
    return out, export(tiny_quark.quark_dir, out, keep_excluded_float=False)
