"""Tuning advice from AMD's packages and the seed articles (severity advice).

Each check cites the setting, its value, the recommended one and why; the
recommended values, thresholds and reasons are the profile's `advice` data,
so a profile without an entry gets no such advice.
"""

from __future__ import annotations

from typing import Mapping

from raipack.checks.base import check
from raipack.npu.genai import known_options as known
from raipack.npu.settings import as_int, fit_to_chunk, minimum_version
from raipack.npu.settings import sdk_version as _sdk_version

GENAI = "genai_config.json"


def advice(ctx, key: str) -> Mapping | None:
    """The profile's advice block `key` (token_backend, max_length, ...), None where it is off."""
    return getattr(ctx.profile.advice, key)


def search(ctx) -> dict:
    g = ctx.genai if isinstance(ctx.genai, dict) else {}
    return g.get("search") if isinstance(g.get("search"), dict) else {}


def _option_advice(ctx, key: str, entry: str):
    rule = advice(ctx, entry)
    if not rule or not isinstance(ctx.genai, dict):
        return
    opts, where = ctx.options
    value = opts.get(key)
    if str(value) == rule["value"]:
        return
    current = "missing" if value is None else f"{value!r}"
    pointer = where.get(key, "/model/decoder/session_options")
    yield ctx.finding(GENAI, f"option {key} is {current}; recommended \"{rule['value']}\": {rule['why']}", f"set {key} to \"{rule['value']}\" in the RyzenAI options", pointer)


@check("RP001", "npu-token-backend", "advice")
def npu_token_backend(ctx):
    """An NPU package selects the NPU for decoding: `hybrid_opt_token_backend`
    is the profile's recommended value (`npu`); absent or `gpu`, decoding falls
    back to a slower path. (A value the runtime rejects is RP403's.)"""
    value = ctx.options[0].get("hybrid_opt_token_backend")
    if value is None or value in known()["token_backends"]:
        yield from _option_advice(ctx, "hybrid_opt_token_backend", "token_backend")


@check("RP002", "kv-cache-fusion", "advice")
def kv_cache_fusion(ctx):
    """KV-cache fusion is on (`fusion_opt_io_bind_kv_cache` "1") where the
    release supports it; missing or "0" loses the largest decode speed-up."""
    yield from _option_advice(ctx, "fusion_opt_io_bind_kv_cache", "kv_cache_fusion")


@check("RP003", "share-buffer", "advice")
def share_buffer(ctx):
    """`search.past_present_share_buffer` is true: false costs memory and
    slows decoding."""
    rule = advice(ctx, "share_buffer")
    s = search(ctx)
    if rule and s and s.get("past_present_share_buffer") is not rule["value"]:
        current = json_text(s.get("past_present_share_buffer", "missing"))
        yield ctx.finding(GENAI, f"search.past_present_share_buffer is {current}; recommended {json_text(rule['value'])}: {rule['why']}", f"set search.past_present_share_buffer to {json_text(rule['value'])}", "/search/past_present_share_buffer")


def json_text(value) -> str:
    return "true" if value is True else "false" if value is False else str(value)


@check("RP004", "chunked-prefill", "advice")
def chunked_prefill(ctx):
    """Chunked prefill (`hybrid_opt_chunk_context` "1") is on when prompts can
    be longer than one NPU pass (`search.chunk_size`, else
    `hybrid_opt_max_seq_length`); without it a long prompt stalls the first
    token or leaves the NPU."""
    rule = advice(ctx, "chunked_prefill")
    if not rule:
        return
    S = ctx.settings
    opts, where = ctx.options
    value, chunk, prompt = opts.get("hybrid_opt_chunk_context"), S.one_pass(), S.longest_prompt()
    if str(value) == rule["value"] or not chunk or not prompt or prompt <= chunk:
        return
    current = "missing" if value is None else repr(value)
    yield ctx.finding(GENAI, f"option hybrid_opt_chunk_context is {current} while prompts of up to {prompt} tokens can exceed one NPU pass of {chunk}; recommended \"{rule['value']}\": {rule['why']}",
                      f"set hybrid_opt_chunk_context to \"{rule['value']}\"", where.get("hybrid_opt_chunk_context", "/model/decoder/session_options"))


@check("RP005", "max-length-fit", "advice")
def max_length_fit(ctx):
    """`search.max_length` is a multiple of `search.chunk_size`, and not above
    the length the release's packages are built for (the profile's limit): the
    KV cache is pre-allocated for max_length tokens. Lower it with `raipack tune
    --max-length` when the use case needs less."""
    rule = advice(ctx, "max_length")
    ml, cs = ctx.settings.max_length, ctx.settings.chunk_size
    if not rule or not ml:
        return
    if rule.get("multiple_of_chunk") and cs and ml % cs:
        fit = fit_to_chunk(ml, cs)  # what the fuse stage writes (pipeline/npu/settings.max_length_for)
        yield ctx.finding(GENAI, f"search.max_length is {ml}, not a multiple of search.chunk_size {cs}; recommended {fit}: {rule['why']}", f"raipack tune --max-length {fit}", "/search/max_length")
    if ml > rule["limit"]:
        kv = kv_bytes(ctx, ml)
        size = f" (about {kv / 2**20:.0f} MiB of KV cache at 16 bits)" if kv else ""
        yield ctx.finding(GENAI, f"search.max_length is {ml}{size}, far above the {rule['limit']} tokens profile {ctx.profile.id} packages are built for; recommended at most {rule['limit']}: {rule['why']}",
                          f"raipack tune --max-length {rule['limit']} (or less, if prompts and answers are shorter)", "/search/max_length")


def kv_bytes(ctx, tokens: int) -> int | None:
    """Bytes of a 16-bit KV cache for `tokens` tokens, from genai_config's dims."""
    g = ctx.genai if isinstance(ctx.genai, dict) else {}
    dec = (g.get("model") or {}).get("decoder") if isinstance(g.get("model"), dict) else None
    if not isinstance(dec, dict):
        return None
    layers, kvh, hs = (as_int(dec.get(k)) for k in ("num_hidden_layers", "num_key_value_heads", "head_size"))
    return 2 * 2 * layers * kvh * hs * tokens if layers and kvh and hs else None


# -- Ryzen AI version --------------------------------------------------------

def sdk_version(ctx, stated: str | None = None) -> tuple[str, str]:
    """(version, where it came from): stated (or the run's `ctx.sdk_version`), else the
    environment's, else the package's release (pipeline/npu/settings.sdk_version)."""
    return _sdk_version(ctx.profile, stated or getattr(ctx, "sdk_version", None))


@check("RP006", "sdk-prompt-limit", "advice")
def sdk_prompt_limit(ctx):
    """The package does not let prompts through that are longer than the
    `max_prompt_length` (rai_config.json) of the Ryzen AI version it runs on:
    the version in $RAIPACK_SDK_VERSION, else the installed one
    ($RYZEN_AI_INSTALLATION_PATH), else the package's release. The longest
    prompt the package takes is one NPU pass (`chunk_size` with chunked
    prefill, else `hybrid_opt_max_seq_length` or `max_length`)."""
    rule = advice(ctx, "sdk_prompt")
    if not rule:
        return
    S = ctx.settings
    allowed = S.single_pass()
    version, source = sdk_version(ctx)
    limit = S.prompt_limit(ctx.profile, version)
    if not allowed or not limit or allowed <= limit[0]:
        return
    newer = minimum_version({**ctx.profile.max_prompt_length, **S.max_prompt}, allowed)
    hint = (f"run it on Ryzen AI {newer} or later, or " if newer else "") + f"keep prompts to {limit[0]} tokens"
    yield ctx.finding(GENAI, f"prompts of up to {allowed} tokens are allowed but Ryzen AI {version} ({source}) takes at most {limit[0]} ({limit[1]}): {rule['why']}", hint, "/search")


# -- sampling ----------------------------------------------------------------

def _number(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@check("RP007", "sampling", "advice")
def sampling(ctx):
    """Decoding settings stay near the package's: `num_beams` at most the
    profile's (1: beam search multiplies the NPU's work), `temperature` at most
    1 (above it is the usual cause of repetition), and temperature, top_p and
    top_k within the profile's tolerance of generation_config.json (or the
    release's defaults when it is absent)."""
    rule = advice(ctx, "sampling")
    s = search(ctx)
    if not rule or not s:
        return
    beams, temp = _number(s.get("num_beams")), _number(s.get("temperature"))
    if "num_beams" in rule and beams and beams > rule["num_beams"]["max"]:
        yield ctx.finding(GENAI, f"search.num_beams is {beams}; recommended {rule['num_beams']['max']}: {rule['num_beams']['why']}", f"set search.num_beams to {rule['num_beams']['max']}", "/search/num_beams")
    if "temperature" in rule and temp is not None and temp > rule["temperature"]["max"]:
        yield ctx.finding(GENAI, f"search.temperature is {temp}; recommended at most {rule['temperature']['max']}: {rule['temperature']['why']}", "set search.temperature back to the generation_config.json value", "/search/temperature")
        s = {k: v for k, v in s.items() if k != "temperature"}  # reported once
    drift = rule.get("drift")
    if not drift:
        return
    gen = ctx.pkg.try_json("generation_config.json")
    ref, source = (gen, "generation_config.json") if isinstance(gen, dict) else (drift["defaults"], f"profile {ctx.profile.id}'s defaults")
    for key, tol in drift["tolerance"].items():
        have, want = _number(s.get(key)), _number(ref.get(key))
        if have is not None and want is not None and abs(have - want) > tol:
            yield ctx.finding(GENAI, f"search.{key} is {have}, far from {want} in {source}; recommended {want}: {drift['why']}", f"set search.{key} to {want}", f"/search/{key}")


# -- bucket tiers ------------------------------------------------------------

@check("RP008", "tier-padding", "advice")
def tier_padding(ctx):
    """No length setting sits just above a compiled bucket tier: a request is
    padded up to the next tier, so a prompt limit, chunk size or max_length a
    little above a tier wastes most of the next one (`raipack inspect` shows
    the tier table)."""
    rule = advice(ctx, "padding")
    if not rule:
        return
    for row in ctx.settings.tier_rows():
        below, tier, value = row["tier_below"], row["tier"], row["value"]
        if not below or not tier or tier == value:
            continue
        if value <= below * (1 + rule["just_above"]) and row["padding"] >= tier * rule["min_waste"]:
            yield ctx.finding(row["file"], f"{row['setting']} is {value}, just above the {row['phase']} tier {below}: it is padded to tier {tier}, {row['padding']} tokens of padding; recommended {below}: {rule['why']}",
                              f"use {below} (or {tier}), a tier the package is compiled for", row["pointer"])
