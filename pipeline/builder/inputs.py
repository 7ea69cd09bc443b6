"""Check a build's input model folder before any heavy work. Nothing in it is run.

Every entry must be a regular file or folder inside the model folder (pipeline/builder/model_files.py
says which symlinks are followed and why); Git LFS pointers are refused. Every JSON file is
read with a size cap, refusing special files (FIFO, device) and JSON that is nested too
deeply or holds non-finite numbers; config.json's architecture comes first (a mixture-of-experts,
multimodal or remote-code model is refused before any weight file is looked at); config.json's sizes and the tokenizer's and generation
config's ids are checked against each other; each safetensors header is read and checked
against its file; the chat template is parsed. Then what transformers will build from the
folder, its config object and its tokenizer, is built once (pipeline/builder/hf_checks.py). Each
refusal is one sentence naming the file and the field, raised before any stage runs (exit 2).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from raipack.builder.hf_checks import (  # their functions import transformers, tokenizers and jinja2 when called
    check_config_class,
    check_generation_config,
    check_tokenizer_json,
    check_tokenizer_loads,
    template_problem,
)
from raipack.builder.model_files import FIX_CONFIG, FIX_GENERATION, FIX_TEMPLATE, FIX_TOKENIZER, LFS_HINT, check_entries, check_safetensors
from raipack.builder.model_files import short as _short
from raipack.core.errors import UsageError
from raipack.core.package import JSON_MAX_BYTES, LFS_MAGIC, JsonError, parse_json
from raipack.data import load_data
from raipack.npu import families

PICKLES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


def check_model_dir(path: Path, trust_remote_code: bool = False) -> Path:
    path = Path(path).expanduser()
    text = str(path)
    if not path.exists():
        if "/" in text and not text.startswith((".", "/", "~")) and text.count("/") == 1:
            raise UsageError(f"{text} is not a local folder; raipack never downloads models (it works offline)", "download the model yourself, then pass its folder: raipack build ./MODEL_DIR")
        raise UsageError(f"model folder {text} does not exist", "pass a local Hugging Face model folder (config.json + *.safetensors)")
    if not path.is_dir():
        raise UsageError(f"{text} is a file; expected a Hugging Face model folder", "pass the folder that holds config.json")
    check_entries(path)  # before any file is opened: links leaving the folder, devices, FIFOs, LFS pointers
    cfg_path = path / "config.json"
    if not os.path.lexists(cfg_path):
        raise UsageError(f"{cfg_path} is missing; expected a Hugging Face model folder", "pass the folder that holds config.json and the *.safetensors weights")
    cfg = read_json(cfg_path)
    if not isinstance(cfg, dict):
        raise UsageError(f"{cfg_path} is not a JSON object", "fix or replace config.json")
    check_architecture(cfg_path, cfg)  # before any weight is looked at: an unsupported model is refused from its config alone
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLES)
        if pickles:
            raise UsageError(f"{path} has only pickle checkpoints ({', '.join(pickles)}); raipack loads safetensors only, because unpickling can run code", "convert the weights to safetensors with a tool you trust, then build again")
        raise UsageError(f"{path} has no *.safetensors weights", "pass a folder with the model's safetensors files")
    for weights_file in weights:
        check_safetensors(weights_file)
    _check_weights_index(path, {w.name for w in weights})
    tok_cfg_path = path / "tokenizer_config.json"
    tok_cfg = read_json(tok_cfg_path, object_only=True) if os.path.lexists(tok_cfg_path) else {}
    if not trust_remote_code:
        for file, doc in ((cfg_path, cfg), (tok_cfg_path, tok_cfg)):
            if doc.get("auto_map"):
                raise UsageError(f"{file} has auto_map: the model needs its own Python code, which raipack does not run by default", "pass --trust-remote-code if you trust this folder's code")
    _check_sizes(cfg_path, cfg)
    _check_tokenizer(path, cfg_path, cfg.get("vocab_size"), tok_cfg)
    generation = _check_generation(path, cfg)
    template = _check_chat_templates(path, tok_cfg)
    if not cfg.get("auto_map"):  # a model of its own code: its config class is its own code too
        check_config_class(cfg_path, cfg)
    if generation is not None:
        check_generation_config(path / "generation_config.json", generation)
    if not tok_cfg.get("auto_map"):  # a tokenizer of its own code is never loaded here (the stages do not trust it either)
        check_tokenizer_loads(path, template)
    return path


def check_architecture(cfg_path: Path, cfg: dict) -> None:
    """Refuse (UsageError, one sentence) a model raipack does not build, from config.json alone:
    the architecture's name (the families of pipeline/data/architectures.json are built), and why when it knows (mixture of
    experts, multimodal, its own Python code), by name or by a config key that gives the kind away.
    --trust-remote-code does not change this: only natively supported architectures are built."""
    data = load_data("architectures.json")
    supported, kinds = families.supported(), data["kinds"]
    archs = cfg.get("architectures")
    name = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if name in supported:
        return
    kind = data["refused"].get(name) or next((k for k in kinds if _clue(cfg, kinds[k])), None)
    why = f", {kinds[kind]['why']}{_clue(cfg, kinds[kind])}" if kind else ""
    note = kinds[kind].get("note", "") if kind else ""
    raise UsageError(f"{cfg_path}: architectures is {_short(archs)}{why}, which raipack does not build{note}; it builds {', '.join(supported)}",
                     "use a dense, text-only model of a supported architecture (see README, supported models)")


def _clue(cfg: dict, spec: dict) -> str:
    """The first config.json key (top level or text_config) that marks the kind, as " (key is value)"; empty if none."""
    docs = [("", cfg)] + ([("text_config.", cfg["text_config"])] if isinstance(cfg.get("text_config"), dict) else [])
    for prefix, doc in docs:
        for key in spec["config_keys"]:
            value = doc.get(key)
            if _is_int(value) or isinstance(value, float):
                if value > 1:  # an expert count; 0 or 1 expert is a dense model
                    return f" ({prefix}{key} is {_short(value, 40)})"
            elif value:
                return f" ({prefix}{key} in config.json)"
    return ""


def read_text(path: Path, what: str = "JSON file") -> str:
    """The UTF-8 text of a file of the model folder, read with a size cap, or UsageError."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise UsageError(f"{path} cannot be read: {exc.strerror or exc}", "check that the file exists and is readable") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{path} is not a regular file (a folder, device, socket or pipe)", f"replace it with the {what}")
        try:
            raw = fh.read(JSON_MAX_BYTES + 1)
        except OSError as exc:
            raise UsageError(f"{path} cannot be read: {exc.strerror or exc}", "check that the file is readable") from None
    if len(raw) > JSON_MAX_BYTES:
        raise UsageError(f"{path} is larger than the {JSON_MAX_BYTES} bytes a {what} may have", "check that the right file was placed here")
    if raw.startswith(LFS_MAGIC):
        raise UsageError(f"{path} is a Git LFS pointer, not the {what}; run `git lfs pull`", LFS_HINT)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 text (byte {exc.start})", "save the file as UTF-8") from None


def read_json(path: Path, object_only: bool = False, text: str | None = None):
    """Parse a JSON file of the model folder (or its `text`, already read), or raise UsageError with one sentence."""
    text = read_text(path) if text is None else text
    if text.startswith("\ufeff"):  # transformers reads these files with json.load, which refuses it
        raise UsageError(f"{path} starts with a byte order mark (BOM), which transformers cannot read", "save the file as UTF-8 without a BOM")
    try:
        doc, _ = parse_json(text)
    except JsonError as exc:
        raise UsageError(f"{path} {exc}", exc.hint) from None
    limit = load_data("model_config.json")["max_json_depth"]
    if _depth(doc, limit) > limit:  # transformers copies these recursively: a RecursionError minutes later
        raise UsageError(f"{path} is nested too deeply (more than {limit} levels)", "check that the right file was placed here")
    if object_only and not isinstance(doc, dict):
        raise UsageError(f"{path} is not a JSON object", f"fix or replace {path.name}")
    return doc


def _check_weights_index(path: Path, names: set[str]) -> None:
    """model.safetensors.index.json may name only safetensors files of the folder itself
    (transformers joins the name to the folder: `../x.safetensors` would load weights from outside)."""
    index_path = path / "model.safetensors.index.json"
    if not os.path.lexists(index_path):
        return
    weight_map = read_json(index_path, object_only=True).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise UsageError(f"{index_path}: weight_map is {_short(weight_map)}; expected an object of tensor name -> safetensors file", "use the index published with the weights")
    unknown = sorted(set(weight_map.values()) - names)
    if unknown:
        raise UsageError(f"{index_path}: weight_map names {_short(unknown[0])}, which is not a safetensors file of the folder", "use the index published with the weights, and every shard it names")


def _depth(doc, limit: int) -> int:
    """How deep lists and objects nest in `doc` (counted up to just past `limit`)."""
    deepest, stack = 0, [(doc, 1)]
    while stack and deepest <= limit:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


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
        text = read_text(tok_path)
        sources.append((tok_path, _tokenizer_ids(tok_path, read_json(tok_path, object_only=True, text=text))))
    elif not (os.path.lexists(path / "tokenizer.model") or os.path.lexists(path / "vocab.json") and os.path.lexists(path / "merges.txt")):
        raise UsageError(f"{path} has no tokenizer: expected tokenizer.json (or tokenizer.model for a SentencePiece model)", FIX_TOKENIZER)
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
    if os.path.lexists(tok_path):
        check_tokenizer_json(tok_path, text)


def _check_generation(path: Path, cfg: dict) -> dict | None:
    """Token ids in config.json and generation_config.json: an integer, or a list of them, below
    vocab_size (a string reaches torch's tensor constructor in generate() otherwise); the
    generation settings generate() reads have their types. Returns generation_config.json's object."""
    vocab_size = cfg.get("vocab_size")
    docs = [(path / "config.json", cfg, FIX_CONFIG)]
    gen_path = path / "generation_config.json"
    gen = read_json(gen_path, object_only=True) if os.path.lexists(gen_path) else None
    if gen is not None:
        docs.append((gen_path, gen, FIX_GENERATION))
    rules = load_data("model_config.json")
    for file, doc, fix in docs:
        for key in rules["token_ids"]:
            value = doc.get(key)
            if value is None or key == "pad_token_id" and value == -1:  # -1: "no padding" in older Llama conversions
                continue
            ids = value if isinstance(value, list) else [value]
            if not ids or not all(_is_int(i) and i >= 0 for i in ids):
                raise UsageError(f"{file}: {key} is {_short(value)}; expected a token id (an integer from 0) or a list of them", fix)
            if _is_int(vocab_size) and max(ids) >= vocab_size:
                raise UsageError(f"{file}: {key} is {_short(value)}, but config.json gives vocab_size {vocab_size}", fix)
    types = rules["generation_config"]
    expected = [("non_negative_integers", lambda v: _is_int(v) and v >= 0, "a non-negative integer"),
                ("numbers", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
                ("booleans", lambda v: isinstance(v, bool), "true or false")]
    for group, ok, what in expected:
        for key in types[group]:
            value = (gen or {}).get(key)
            if value is not None and not ok(value):
                raise UsageError(f"{gen_path}: {key} is {_short(value)}; expected {what}", FIX_GENERATION)
    return gen


def _check_chat_templates(path: Path, tok_cfg: dict) -> str | None:
    """Parse every chat template of the folder without running it (pipeline/builder/hf_checks.py says
    what is refused); returns where the template the tokenizer uses comes from, for messages."""
    templates = []  # (where, source)
    jinja = path / "chat_template.jinja"
    if os.path.lexists(jinja):
        templates.append((str(jinja), read_text(jinja, "chat template")))
    where = f"{path / 'tokenizer_config.json'}: chat_template"
    value = tok_cfg.get("chat_template")
    if isinstance(value, str):
        templates.append((where, value))
    elif isinstance(value, list) and all(isinstance(t, dict) and isinstance(t.get("template"), str) for t in value):
        templates += [(f"{where} {_short(t.get('name'), 40)}", t["template"]) for t in value]
    elif value is not None:
        raise UsageError(f"{where} is {_short(value)}; expected a string, or a list of objects with name and template", FIX_TEMPLATE)
    extra = path / "additional_chat_templates"
    if extra.is_dir():
        templates += [(str(f), read_text(f, "chat template")) for f in sorted(extra.glob("*.jinja"))]
    for label, source in templates:
        problem = template_problem(source)
        if problem:
            raise UsageError(f"{label} {problem}", FIX_TEMPLATE)
    return templates[0][0] if templates else None
