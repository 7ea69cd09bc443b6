"""A model's dimensions as a package's configs give them (layers, heads, KV heads, head size,
hidden size, vocabulary), each with the file and JSON pointer it came from."""

from __future__ import annotations

from raipack.npu.genai import table
from raipack.npu.settings import as_count as _count

GENAI = "genai_config.json"


def model_dims(genai, model_config) -> dict[str, dict[str, tuple[int, str, str]]]:
    """dimension → source label → (value, file, pointer), from genai_config.json and config.json
    (parsed; anything else reads as empty)."""
    out: dict[str, dict] = {}

    def put(dim, label, value, file, pointer):
        v = _count(value)  # zero or negative is RP202's finding, not a second one here
        if v is not None:
            out.setdefault(dim, {})[label] = (v, file, pointer)

    model = table(genai, "model")
    dec = table(model, "decoder")
    for dim, key in (("layers", "num_hidden_layers"), ("heads", "num_attention_heads"), ("kv_heads", "num_key_value_heads"), ("head_size", "head_size"), ("hidden", "hidden_size")):
        put(dim, "genai_config", dec.get(key), GENAI, f"/model/decoder/{key}")
    put("vocab", "genai_config", model.get("vocab_size"), GENAI, "/model/vocab_size")
    text = text_config(model_config)
    for dim, key in (("layers", "num_hidden_layers"), ("heads", "num_attention_heads"), ("kv_heads", "num_key_value_heads"), ("hidden", "hidden_size"), ("vocab", "vocab_size"), ("head_size", "head_dim")):
        put(dim, "config", text.get(key), "config.json", f"/{key}")
    if "config" not in out.get("kv_heads", {}) and _count(text.get("num_attention_heads")) and "num_key_value_heads" not in text:
        put("kv_heads", "config", text.get("num_attention_heads"), "config.json", "/num_attention_heads")
    h, n = _count(text.get("hidden_size")), _count(text.get("num_attention_heads"))
    if h and n and "head_dim" not in text:
        put("head_size", "config", h // n, "config.json", "/hidden_size")
    return out


def text_config(model_config) -> dict:
    """The text model's fields of a config.json: its `text_config` where a wrapper keeps the decoder's
    sizes there (no `hidden_size` of its own), else the document itself ({} for anything that is not
    an object). The one rule for quantize, export, the checks and the runtime."""
    cfg = model_config if isinstance(model_config, dict) else {}
    text = cfg.get("text_config")
    return text if "hidden_size" not in cfg and isinstance(text, dict) else cfg


def parameter_count(model_config) -> int:
    """A decoder-only model's parameters from its config.json: attention, MLP and norms per layer, the
    embedding (and an untied lm_head); ValueError when a size is missing."""
    c = text_config(model_config)
    sizes = {k: _count(c.get(k)) for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")}
    missing = [k for k, v in sizes.items() if not v]
    if missing:
        raise ValueError(f"config.json has no integer {', '.join(missing)}")
    h, i, layers, heads, vocab = sizes.values()
    kv, head_dim = _kv_heads(c, h, heads)
    layer = 2 * h * heads * head_dim + 2 * h * kv * head_dim + 3 * h * i + 2 * h
    tied = bool(c.get("tie_word_embeddings", model_config.get("tie_word_embeddings", False)))
    return layers * layer + vocab * h * (1 if tied else 2) + h


def _kv_heads(c: dict, hidden: int, heads: int) -> tuple[int, int]:
    """(KV heads, head size) of a text config: num_key_value_heads (else the heads), head_dim (else hidden / heads)."""
    return _count(c.get("num_key_value_heads")) or heads, _count(c.get("head_dim")) or hidden // heads


def kv_width(model_config) -> int:
    """Layers x KV heads x head size: the elements of one position's keys (or values) in every layer; 0 when a size is missing."""
    c = text_config(model_config)
    layers, hidden, heads = (_count(c.get(k)) for k in ("num_hidden_layers", "hidden_size", "num_attention_heads"))
    if not (layers and hidden and heads):
        return 0
    kv, head_dim = _kv_heads(c, hidden, heads)
    return layers * kv * head_dim
