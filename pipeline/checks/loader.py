"""genai_config.json as the package's own onnxruntime-genai loader reads it."""

from __future__ import annotations

from raipack.checks.base import check
from raipack.core.package import JSON_MAX_BYTES, ReadError
from raipack.npu.loader_choice import loader_for
from raipack.npu.loader_config import judge

NAME = "genai_config.json"


@check("RP204", "genai-loader")
def genai_loader(ctx):
    """`genai_config.json` loads in the onnxruntime-genai version that will read it: the version of the
    package's Ryzen AI release (the release catalog cites AMD's docs for each; AMD's build of it, with
    the keys AMD's published packages show it reads), the version recorded in raipack's manifest for
    an export, else the newest one raipack knows. What each version accepts (every key at every level,
    its JSON type, the numbers it checks) is generated from that version's `src/config.cpp` and held
    against its real wheel in the tests: a misspelled key (`search.tpo_p`), a value of the wrong type,
    a key the release's loader does not know yet, a `\\uXXXX` escape or a byte order mark (the loader
    refuses both), a document that is not an object, and a missing `model.context_length` are
    errors, each with the loader's own words and the nearest known key."""
    fe = ctx.pkg.files.get(NAME)
    if fe is None or fe.lfs:
        return
    try:
        raw = ctx.pkg.raw_json(NAME, JSON_MAX_BYTES)
    except ReadError:
        return  # RP201 says why it cannot be read
    choice = loader_for(ctx.pkg, ctx.profile)
    for refusal in judge(raw, choice.version, amd=choice.amd):
        stricter = " (raipack is stricter than this loader here)" if refusal.stricter else ""
        yield ctx.finding(NAME, f"{choice.describe()} refuses it: {refusal.message}{stricter}", refusal.hint, refusal.pointer)
