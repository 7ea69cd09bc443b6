"""Check a build's input model folder before any heavy work. Nothing in it is run.

Every JSON file is read with a size cap, refusing special files (FIFO, device) and
JSON that is nested too deeply or holds non-finite numbers; config.json's sizes and
the tokenizer's ids are checked against each other. Each refusal is one sentence
naming the file and the field, raised before any stage runs (exit code 2).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .data import load_data
from .errors import UsageError
from .package import JSON_MAX_BYTES, JsonError, parse_json

PICKLES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
FIX_CONFIG = "fix config.json, or use the config.json the model was published with"
FIX_TOKENIZER = "use the tokenizer files published with this model"


def check_model_dir(path: Path, trust_remote_code: bool = False) -> Path:
    path = Path(path).expanduser()
    text = str(path)
    if not path.exists():
        if "/" in text and not text.startswith((".", "/", "~")) and text.count("/") == 1:
            raise UsageError(f"{text} is not a local folder; raipack never downloads models (it works offline)", "download the model yourself, then pass its folder: raipack build ./MODEL_DIR")
        raise UsageError(f"model folder {text} does not exist", "pass a local Hugging Face model folder (config.json + *.safetensors)")
    if not path.is_dir():
        raise UsageError(f"{text} is a file; expected a Hugging Face model folder", "pass the folder that holds config.json")
    cfg_path = path / "config.json"
    if not os.path.lexists(cfg_path):
        raise UsageError(f"{cfg_path} is missing; expected a Hugging Face model folder", "pass the folder that holds config.json and the *.safetensors weights")
    cfg = read_json(cfg_path)
    if not isinstance(cfg, dict):
        raise UsageError(f"{cfg_path} is not a JSON object", "fix or replace config.json")
    if not list(path.glob("*.safetensors")):
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLES)
        if pickles:
            raise UsageError(f"{path} has only pickle checkpoints ({', '.join(pickles)}); raipack loads safetensors only, because unpickling can run code", "convert the weights to safetensors with a tool you trust, then build again")
        raise UsageError(f"{path} has no *.safetensors weights", "pass a folder with the model's safetensors files")
    archs = cfg.get("architectures")
    supported = load_data("architectures.json")["supported"]
    if not isinstance(archs, list) or not archs or archs[0] not in supported:
        raise UsageError(f"{cfg_path}: architectures is {_short(archs)}; raipack builds {', '.join(supported)}", "use a model of a supported architecture (see README, supported models)")
    tok_cfg_path = path / "tokenizer_config.json"
    tok_cfg = read_json(tok_cfg_path, object_only=True) if os.path.lexists(tok_cfg_path) else {}
    if not trust_remote_code:
        for file, doc in ((cfg_path, cfg), (tok_cfg_path, tok_cfg)):
            if doc.get("auto_map"):
                raise UsageError(f"{file} has auto_map: the model needs its own Python code, which raipack does not run by default", "pass --trust-remote-code if you trust this folder's code")
    _check_sizes(cfg_path, cfg)
    _check_tokenizer(path, cfg_path, cfg.get("vocab_size"), tok_cfg)
    return path


def read_json(path: Path, object_only: bool = False):
    """Parse a JSON file of the model folder, or raise UsageError with one sentence."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise UsageError(f"{path} cannot be read: {exc.strerror or exc}", "check that the file exists and is readable") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{path} is not a regular file (a folder, device, socket or pipe)", "replace it with the JSON file")
        try:
            raw = fh.read(JSON_MAX_BYTES + 1)
        except OSError as exc:
            raise UsageError(f"{path} cannot be read: {exc.strerror or exc}", "check that the file is readable") from None
    if len(raw) > JSON_MAX_BYTES:
        raise UsageError(f"{path} is larger than the {JSON_MAX_BYTES} bytes a JSON file may have", "check that the right file was placed here")
    try:
        doc, _ = parse_json(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 text (byte {exc.start})", "save the file as UTF-8") from None
    except JsonError as exc:
        raise UsageError(f"{path} {exc}", exc.hint) from None
    if object_only and not isinstance(doc, dict):
        raise UsageError(f"{path} is not a JSON object", f"fix or replace {path.name}")
    return doc


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_sizes(cfg_path: Path, cfg: dict) -> None:
    rules = load_data("model_config.json")
    top = rules["max_integer"]
    for key in rules["positive_integers"]:
        value = cfg.get(key)
        if value is not None and not (_is_int(value) and 0 < value <= top):
            raise UsageError(f"{cfg_path}: {key} is {_short(value)}; expected a positive integer up to {top}", FIX_CONFIG)
    for key in rules["positive_numbers"]:
        value = cfg.get(key)
        if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0):
            raise UsageError(f"{cfg_path}: {key} is {_short(value)}; expected a positive number", FIX_CONFIG)
    for key in rules["strings"]:
        value = cfg.get(key)
        if value is not None and not isinstance(value, str):
            raise UsageError(f"{cfg_path}: {key} is {_short(value)}; expected a string", FIX_CONFIG)
    heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
    if heads and kv and heads % kv:
        raise UsageError(f"{cfg_path}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}", FIX_CONFIG)


def _tokenizer_ids(tok_path: Path, tok: dict):
    """(id, label) of every token tokenizer.json defines: its model's vocabulary and added tokens."""
    model = tok.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):
        yield from ((i, f"model.vocab token {_short(t, 40)}") for t, i in vocab.items())
    elif isinstance(vocab, list):  # Unigram: [piece, score] pairs, the id is the position
        yield from ((i, "model.vocab") for i in range(len(vocab)))
    elif vocab is not None:
        raise UsageError(f"{tok_path}: model.vocab is {_short(vocab)}; expected an object of token ids", FIX_TOKENIZER)
    added = tok.get("added_tokens") or []
    if not isinstance(added, list):
        raise UsageError(f"{tok_path}: added_tokens is {_short(added)}; expected a list", FIX_TOKENIZER)
    for entry in added:
        entry = entry if isinstance(entry, dict) else {}
        yield entry.get("id"), f"added_tokens token {_short(entry.get('content'), 40)}"


def _check_tokenizer(path: Path, cfg_path: Path, vocab_size, tok_cfg: dict) -> None:
    """No token id beyond the embedding: the first calibration batch would fail with a
    bare IndexError deep inside torch. Read here as plain JSON, never through transformers."""
    sources = []
    tok_path, added_path = path / "tokenizer.json", path / "added_tokens.json"
    if os.path.lexists(tok_path):
        sources.append((tok_path, _tokenizer_ids(tok_path, read_json(tok_path, object_only=True))))
    if os.path.lexists(added_path):
        sources.append((added_path, ((i, f"token {_short(t, 40)}") for t, i in read_json(added_path, object_only=True).items())))
    decoder = tok_cfg.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        sources.append((path / "tokenizer_config.json", ((int(k) if k.isdigit() else k, f"added_tokens_decoder key {_short(k, 40)}") for k in decoder)))
    for file, ids in sources:
        for token_id, label in ids:
            if not _is_int(token_id) or token_id < 0:
                raise UsageError(f"{file}: {label} has id {_short(token_id)}; expected a token id (an integer from 0)", FIX_TOKENIZER)
            if _is_int(vocab_size) and token_id >= vocab_size:
                raise UsageError(f"{file}: {label} has id {token_id}, but {cfg_path} gives vocab_size {vocab_size}: the tokenizer is larger than the model's embedding",
                                 "use the tokenizer published with this model, or a config.json whose vocab_size covers every token id")
