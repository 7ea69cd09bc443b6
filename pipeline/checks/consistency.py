"""Lengths, dimensions and special token ids agree across files."""

from __future__ import annotations

from itertools import chain

from raipack.checks.base import check
from raipack.npu.dims import model_dims as _model_dims
from raipack.npu.dims import text_config
from raipack.npu.settings import as_count as _count
from raipack.npu.target import Target

GENAI = "genai_config.json"


@check("RP501", "length-limits", "warning")
def length_limits(ctx):
    """The length settings agree: `search.max_length` ≤ `context_length`;
    `chunk_size` ≤ `max_length`; `max_length_for_kv_cache` ≥ `max_length`;
    every `rai_config.max_prompt_length` ≤ `max_length` and, without chunked
    prefill, ≤ `hybrid_opt_max_seq_length` (so is a hybrid package's
    `max_length`: AMD documents chunked prefill for hybrid models past 4096
    tokens in total); and no higher than the NPU limit
    the profile records for that Ryzen AI version. Each disagreement is a
    warning that names the length past which requests fail: the package runs
    every shorter one (AMD's 1.6 NPU folders ship `max_length` 32768 over a
    4096-token KV buffer and run up to 4096 tokens)."""
    L = ctx.settings.as_dict()
    ml, cs, cl, kv, seq = L["max_length"], L["chunk_size"], L["context_length"], L["kv_cache"], L["npu_seq"]
    if ml and cl and ml > cl:
        yield ctx.finding(GENAI, f"search.max_length is {ml}, above model.context_length {cl}: past {cl} tokens the model runs beyond the positions it was trained for", f"lower search.max_length to at most {cl} (raipack tune --max-length {cl})", "/search/max_length")
    if cs and ml and cs > ml:
        yield ctx.finding(GENAI, f"search.chunk_size is {cs}, above search.max_length {ml}: no prompt reaches one chunk; a prompt past {ml} tokens fails on max_length first", "make chunk_size at most max_length", "/search/chunk_size")
    if kv and ml and kv < ml:
        _, where = ctx.options
        yield ctx.finding(GENAI, f"max_length_for_kv_cache is {kv}, below search.max_length {ml}: the static KV buffer holds {kv} tokens, so a request whose prompt and output pass {kv} tokens fails; shorter ones run", f"keep prompt + output within {kv} tokens, or lower search.max_length to {kv} (raipack tune --max-length {kv})", where["max_length_for_kv_cache"])
    elif ml and seq and ml > seq and not L["chunked"] and ctx.profile.target is Target.HYBRID:
        yield ctx.finding(GENAI, f"search.max_length is {ml}, above hybrid_opt_max_seq_length {seq} with chunked prefill off: past {seq} tokens in total a hybrid package needs chunked prefill", f"keep prompt + output within {seq} tokens, or turn on chunked prefill: hybrid_opt_chunk_context \"1\" and a search.chunk_size (AMD's long-context steps)", "/search/max_length")
    limits = ctx.profile.max_prompt_length
    for version, n in sorted(L["max_prompt"].items()):
        pointer = f"/max_prompt_length/{version}"
        if ml and n > ml:
            yield ctx.finding("rai_config.json", f"max_prompt_length for {version} is {n}, above search.max_length {ml}: a prompt the application lets through past {ml} tokens fails", "lower it to at most max_length", pointer)
        elif seq and n > seq and not L["chunked"]:
            yield ctx.finding("rai_config.json", f"max_prompt_length for {version} is {n}, above hybrid_opt_max_seq_length {seq} with chunked prefill off: a prompt past {seq} tokens does not fit one NPU pass and fails", "lower it, or turn on hybrid_opt_chunk_context", pointer)
        if version in limits and n > limits[version]:
            yield ctx.finding("rai_config.json", f"max_prompt_length for {version} is {n}, above the {limits[version]} tokens Ryzen AI {version} allows", "lower it to the SDK's limit", pointer, "warning")


def dims(ctx) -> dict[str, dict[str, tuple[int, str, str]]]:
    """dimension → source label → (value, file, pointer)."""
    return _model_dims(ctx.genai, ctx.model_config)


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
    for _label, (v, file, pointer) in vocab.items():
        if n_tok and n_tok > v:
            yield ctx.finding("tokenizer.json", f"has {n_tok} tokens, more than the model's vocabulary of {v} ({file} {pointer})", "use the tokenizer the model was trained with")
            break


def tokenizer_size(ctx) -> int | None:
    tok = ctx.pkg.try_json("tokenizer.json")
    if not isinstance(tok, dict) or not isinstance(tok.get("model"), dict):
        return None
    vocab = tok["model"].get("vocab")
    ids = vocab.values() if isinstance(vocab, dict) else range(len(vocab)) if isinstance(vocab, list) else ()
    added = [t.get("id") for t in tok.get("added_tokens") or [] if isinstance(t, dict)]
    top = max((i for i in chain(ids, added) if isinstance(i, int)), default=None)  # no set: a list as an id is skipped, not a crash
    return None if top is None else top + 1


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


def _text_config(ctx) -> dict:
    return text_config(ctx.model_config)


def _decoder(ctx) -> dict:
    model = ctx.genai.get("model") if isinstance(ctx.genai, dict) else None
    dec = model.get("decoder") if isinstance(model, dict) else None
    return dec if isinstance(dec, dict) else {}


def sliding_layers(text: dict) -> tuple[int | None, list[int]]:
    """(window, the layers that attend within it) as transformers reads config.json: `layer_types`,
    else Gemma 3's `sliding_window_pattern` (every p-th layer global), else Qwen's `use_sliding_window`
    from `max_window_layers` on, else every layer (Mistral v0.1)."""
    window, n = _count(text.get("sliding_window")), _count(text.get("num_hidden_layers")) or 0
    types, pattern = text.get("layer_types"), _count(text.get("sliding_window_pattern"))
    if not window:
        return None, []
    if isinstance(types, list):
        return window, [i for i, kind in enumerate(types) if kind == "sliding_attention"]
    if pattern:
        return window, [i for i in range(n) if (i + 1) % pattern]
    if "use_sliding_window" in text:
        start = _count(text.get("max_window_layers")) or 0
        return window, [i for i in range(n) if text["use_sliding_window"] is True and i >= start]
    return window, list(range(n))


@check("RP504", "sliding-window")
def sliding_window(ctx):
    """Where genai_config.json gives the decoder a `sliding_window`, config.json's model has one:
    the same `window_size` as its `sliding_window`, on the layers it makes local (`layer_types`;
    Gemma 3's `sliding_window_pattern`, every sixth layer global; Qwen's `use_sliding_window` and
    `max_window_layers`; every layer for Mistral v0.1). A model without a window given one attends
    too little; a window of another size or on other layers changes every answer past it. A window
    at least as long as the model's context (Phi-4-mini's 262144), or one on no layer, is none."""
    block = _decoder(ctx).get("sliding_window")
    if not isinstance(block, dict) or not isinstance(ctx.model_config, dict):
        return
    text = _text_config(ctx)
    window, local = sliding_layers(text)
    context = _count(text.get("max_position_embeddings"))
    if window and context and window >= context:  # Phi-4-mini's 262144: no window within its context
        window, local = None, []
    pointer = "/model/decoder/sliding_window"
    size, layers = block.get("window_size"), block.get("layers")
    in_effect = _count(size) and (not context or size < context) and layers != []
    if not local:
        if in_effect:
            yield ctx.finding(GENAI, f"sets a sliding window of {size} tokens at {pointer}, but config.json's model attends over the whole context (no sliding_window in effect)",
                              "remove the sliding_window block, or rebuild from the checkpoint it was made for", pointer)
    elif size != window:
        yield ctx.finding(GENAI, f"{pointer}/window_size is {size}, but config.json's sliding_window is {window}", "rebuild the package from one checkpoint; the files come from different models", pointer + "/window_size")
    elif isinstance(layers, list) and sorted(v for v in layers if isinstance(v, int)) != local:
        yield ctx.finding(GENAI, f"{pointer}/layers lists {_ranges(layers)} as sliding-window layers, but config.json makes layers {_ranges(local)} local",
                          "rebuild the package from one checkpoint; the files come from different models", pointer + "/layers")


def _ranges(values: list) -> str:
    shown = [str(v) for v in values[:12]]
    return "[" + ", ".join(shown) + (", …" if len(values) > 12 else "") + "]"


@check("RP505", "rope-dims")
def rope_dims(ctx):
    """LongRoPE's per-dimension factors fit the rotary part of a head: config.json's
    `rope_scaling.long_factor` and `short_factor` hold `head_size × partial_rotary_factor / 2` values
    (head size from genai_config.json, else config.json). Phi-4-mini rotates 96 of its 128 head
    dimensions (factor 0.75): 48 factors, where a full rotary would take 64."""
    text = _text_config(ctx)
    scaling = text.get("rope_scaling")
    if not isinstance(scaling, dict):
        return
    sources = dims(ctx).get("head_size", {})
    head = next((v for v, _, _ in sources.values()), None)
    factor = text.get("partial_rotary_factor", 1.0)
    if not head or not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor <= 1:
        return
    want = int(head * factor) // 2
    for key in ("long_factor", "short_factor"):
        values = scaling.get(key)
        if isinstance(values, list) and len(values) != want:
            yield ctx.finding("config.json", f"rope_scaling.{key} has {len(values)} values, but a head of {head} with partial_rotary_factor {factor} rotates {2 * want} dimensions: {want} expected",
                              "rebuild the package from one checkpoint; the rope factors come from another model", f"/rope_scaling/{key}")
