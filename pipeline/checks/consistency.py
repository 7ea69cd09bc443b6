"""Lengths, dimensions and special token ids agree across files."""

from __future__ import annotations

from pipeline.checks import check

GENAI = "genai_config.json"


def _int(value):
    """An int from an int or a string of decimal digits ("4096"), else None
    (a mistyped value is RP202's or RP401's finding, never a crash here)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdecimal():
        try:
            return int(value)
        except ValueError:  # more digits than Python converts
            return None
    return None


def _count(value):
    """A positive int (a length, a dimension), else None."""
    n = _int(value)
    return n if n is not None and n > 0 else None


def lengths(ctx) -> dict:
    """The length settings of a package, as ints where they are set."""
    g = ctx.genai if isinstance(ctx.genai, dict) else {}
    search = g.get("search") if isinstance(g.get("search"), dict) else {}
    model = g.get("model") if isinstance(g.get("model"), dict) else {}
    opts, _ = ctx.options
    rai = ctx.rai_config if isinstance(ctx.rai_config, dict) else {}
    mpl = rai.get("max_prompt_length") if isinstance(rai.get("max_prompt_length"), dict) else {}
    return {
        "max_length": _count(search.get("max_length")),
        "chunk_size": _count(search.get("chunk_size")),
        "context_length": _count(model.get("context_length")),
        "kv_cache": _count(opts.get("max_length_for_kv_cache")),
        "npu_seq": _count(opts.get("hybrid_opt_max_seq_length")),
        "chunked": str(opts.get("hybrid_opt_chunk_context", "0")) == "1",
        "max_prompt": {v: n for v, n in ((v, _count(n)) for v, n in mpl.items()) if n is not None},
    }


@check("RP501", "length-limits")
def length_limits(ctx):
    """The length settings agree: `search.max_length` ≤ `context_length`;
    `chunk_size` ≤ `max_length`; `max_length_for_kv_cache` ≥ `max_length`;
    every `rai_config.max_prompt_length` ≤ `max_length` and, without chunked
    prefill, ≤ `hybrid_opt_max_seq_length`; and no higher than the NPU limit
    the profile records for that Ryzen AI version."""
    L = lengths(ctx)
    ml, cs, cl, kv, seq = L["max_length"], L["chunk_size"], L["context_length"], L["kv_cache"], L["npu_seq"]
    if ml and cl and ml > cl:
        yield ctx.finding(GENAI, f"search.max_length is {ml}, above model.context_length {cl}", "lower search.max_length (raipack tune --max-length)", "/search/max_length")
    if cs and ml and cs > ml:
        yield ctx.finding(GENAI, f"search.chunk_size is {cs}, above search.max_length {ml}", "make chunk_size at most max_length", "/search/chunk_size")
    if kv and ml and kv < ml:
        _, where = ctx.options
        yield ctx.finding(GENAI, f"max_length_for_kv_cache is {kv}, below search.max_length {ml}: the static KV buffer cannot hold a full sequence", "raise max_length_for_kv_cache or lower search.max_length", where["max_length_for_kv_cache"])
    limits = ctx.profile.get("max_prompt_length", {})
    for version, n in sorted(L["max_prompt"].items()):
        pointer = f"/max_prompt_length/{version}"
        if ml and n > ml:
            yield ctx.finding("rai_config.json", f"max_prompt_length for {version} is {n}, above search.max_length {ml}", "lower it to at most max_length", pointer)
        elif seq and n > seq and not L["chunked"]:
            yield ctx.finding("rai_config.json", f"max_prompt_length for {version} is {n}, above hybrid_opt_max_seq_length {seq} with chunked prefill off: the NPU cannot hold such a prompt", "lower it, or turn on hybrid_opt_chunk_context", pointer)
        if version in limits and n > limits[version]:
            yield ctx.finding("rai_config.json", f"max_prompt_length for {version} is {n}, above the {limits[version]} tokens Ryzen AI {version} allows", "lower it to the SDK's limit", pointer, "warning")


def dims(ctx) -> dict[str, dict[str, tuple[int, str, str]]]:
    """dimension → source label → (value, file, pointer)."""
    out: dict[str, dict] = {}

    def put(dim, label, value, file, pointer):
        v = _count(value)  # zero or negative is RP202's finding, not a second one here
        if v is not None:
            out.setdefault(dim, {})[label] = (v, file, pointer)

    g = ctx.genai if isinstance(ctx.genai, dict) else {}
    model = g.get("model") if isinstance(g.get("model"), dict) else {}
    dec = model.get("decoder") if isinstance(model.get("decoder"), dict) else {}
    for dim, key in (("layers", "num_hidden_layers"), ("heads", "num_attention_heads"), ("kv_heads", "num_key_value_heads"), ("head_size", "head_size"), ("hidden", "hidden_size")):
        put(dim, "genai_config", dec.get(key), GENAI, f"/model/decoder/{key}")
    put("vocab", "genai_config", model.get("vocab_size"), GENAI, "/model/vocab_size")
    cfg = ctx.model_config if isinstance(ctx.model_config, dict) else {}
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    for dim, key in (("layers", "num_hidden_layers"), ("heads", "num_attention_heads"), ("kv_heads", "num_key_value_heads"), ("hidden", "hidden_size"), ("vocab", "vocab_size"), ("head_size", "head_dim")):
        put(dim, "config", text.get(key), "config.json", f"/{key}")
    if "config" not in out.get("kv_heads", {}) and _count(text.get("num_attention_heads")) and "num_key_value_heads" not in text:
        put("kv_heads", "config", text.get("num_attention_heads"), "config.json", "/num_attention_heads")
    h, n = _count(text.get("hidden_size")), _count(text.get("num_attention_heads"))
    if h and n and "head_dim" not in text:
        put("head_size", "config", h // n, "config.json", "/hidden_size")
    return out


@check("RP502", "model-dims")
def model_dims(ctx):
    """Layer, head, KV-head, head-size, hidden-size and vocabulary counts agree
    between genai_config.json and config.json; the tokenizer has no more tokens
    than the model's vocabulary. (The graph's own shapes are RP703.)"""
    for dim, sources in dims(ctx).items():
        if len({v for v, _, _ in sources.values()}) > 1:
            (v1, f1, p1), (v2, f2, p2) = list(sources.values())[:2]
            yield ctx.finding(f1, f"{dim} is {v1} at {p1} but {v2} in {f2} at {p2}", "rebuild the package from one checkpoint; the files come from different models", p1)
    n_tok = tokenizer_size(ctx)
    vocab = dims(ctx).get("vocab", {})
    for label, (v, file, pointer) in vocab.items():
        if n_tok and n_tok > v:
            yield ctx.finding("tokenizer.json", f"has {n_tok} tokens, more than the model's vocabulary of {v} ({file} {pointer})", "use the tokenizer the model was trained with")
            break


def tokenizer_size(ctx) -> int | None:
    tok = ctx.pkg.try_json("tokenizer.json")
    if not isinstance(tok, dict) or not isinstance(tok.get("model"), dict):
        return None
    vocab = tok["model"].get("vocab")
    ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab))) if isinstance(vocab, list) else set()
    ids |= {t.get("id") for t in tok.get("added_tokens") or [] if isinstance(t, dict)}
    ids = {i for i in ids if isinstance(i, int)}
    return (max(ids) + 1) if ids else None


@check("RP503", "special-token-ids")
def special_token_ids(ctx):
    """`bos_token_id`, `eos_token_id` (an id or a list) and `pad_token_id` in
    genai_config.json and generation_config.json lie inside the vocabulary."""
    vocab = dims(ctx).get("vocab", {})
    size = min((v for v, _, _ in vocab.values()), default=None)
    if not size:
        return
    docs = (("genai_config.json", ctx.genai, "/model"), ("generation_config.json", ctx.pkg.try_json("generation_config.json"), ""))
    for file, doc, base in docs:
        node = doc.get("model") if file == GENAI and isinstance(doc, dict) else doc
        if not isinstance(node, dict):
            continue
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = node.get(key)
            for i, tid in enumerate(value if isinstance(value, list) else [value]):
                if isinstance(tid, int) and not isinstance(tid, bool) and not 0 <= tid < size:
                    pointer = f"{base}/{key}" + (f"/{i}" if isinstance(value, list) else "")
                    yield ctx.finding(file, f"{key} is {tid}, outside the vocabulary of {size} tokens", "use the id the tokenizer gives that token", pointer)
