"""raipack reference packages: the metastate plans, schedules and states (RP905), the provider
options against the header's tiers (RP906) and the decoder nodes left on the CPU (RP907). The
header is read once through npu/reference.py; see checks/npu_format.py for when the RP9xx checks run."""

from __future__ import annotations

import hashlib
import json
from typing import NamedTuple

from raipack.checks.base import check
from raipack.core import schemas
from raipack.core.package import JSON_MAX_BYTES, ReadError
from raipack.npu import formats as fmt
from raipack.npu import plans
from raipack.npu.layout import TIERED, metastate_sets
from raipack.npu.reference import parsed_header, small_file
from raipack.npu.settings import expected_tiers, pow2_ceil, pow2_floor, tierless

GENAI = "genai_config.json"


_SCHEMA_ERRORS: dict[tuple[str, str], list] = {}


def _schema_errors(name: str, sha: str, doc: dict) -> list:
    """The schema errors of a plan or schedule, remembered by its sha256: a process that validates
    copies of a package sees each file again."""
    key = (name, sha)
    errs = _SCHEMA_ERRORS.get(key)
    if errs is None:
        errs = schemas.errors(name, doc)
        if len(_SCHEMA_ERRORS) >= 1024:
            _SCHEMA_ERRORS.clear()
        _SCHEMA_ERRORS[key] = errs
    return errs


def _graph_sha(ctx, grel):
    """The sha256 of the package's graph, or None when there is none, it is an LFS pointer or cannot be read."""
    if not grel or ctx.pkg.files[grel].lfs:
        return None
    try:
        h = hashlib.sha256()
        with ctx.pkg.open(grel) as fh:  # refuses a file swapped for a FIFO since the scan
            for block in iter(lambda: fh.read(8 << 20), b""):
                h.update(block)
        return h.hexdigest()
    except (OSError, ReadError):
        return None  # RP701 says why the graph cannot be read


class _PlanFile(NamedTuple):
    """A `dd_metastate_<phase>_<tier>` plan: its path, and the phase and tier its name says."""

    rel: str
    phase: str
    tier: int


def _state_findings(ctx, srel, which: _PlanFile, plan_sha, header, graph):
    """A `.state` file against its plan, the header and the graph it was written for."""
    plan_rel, phase, tier = which
    (rel, header_sha), (grel, graph_sha) = header, graph
    try:
        state = fmt.decode_state(small_file(ctx, srel), srel)
    except (fmt.FormatError, ReadError) as err:
        yield ctx.finding(srel, str(err), err.hint)
        return
    if state.get("plan_sha256") != plan_sha:
        yield ctx.finding(srel, f"records another sha256 for {plan_rel.rsplit('/', 1)[-1]} (the plan was edited or swapped)", "rebuild the package", "/plan_sha256")
    if state.get("header_sha256") != header_sha:
        yield ctx.finding(srel, f"was written for another {rel}", "rebuild the package; files of different builds were mixed", "/header_sha256")
    if graph_sha and state.get("graph_sha256") != graph_sha:
        yield ctx.finding(srel, f"was written for another {grel}", "rebuild the package; files of different builds were mixed", "/graph_sha256")
    if state.get("phase") != phase or state.get("tier") != tier:
        yield ctx.finding(srel, f"is the state of {state.get('phase')} tier {state.get('tier')}, not of {phase} tier {tier}", "rebuild the package")


@check("RP905", "metastate-plans")
def metastate_plans(ctx):
    """In a raipack package, every `dd_metastate_*` set's `.plan` follows
    schemas/metastate_plan.schema.json (format version 2; a plan of an older
    version is reported once: rebuild the package) and names its phase's
    shared schedule, `cache/<node>_<phase>.schedule.json`, with that file's
    sha256; the schedule follows schemas/metastate_schedule.schema.json and
    is consistent (shapes of integers, S or T; buffer lifetimes within its
    steps). Each plan is consistent with it (phase, tier and sequence length
    match the file name; the graph inputs, logits and every buffer's bytes
    fit the tier's shapes; buffers live at the same step never overlap and
    stay inside the arena; the KV bindings are [1, kv_heads, window,
    head_size] in disjoint regions of max_length positions); its `.state`
    records the sha256 of that plan, of `model.pb.bin` and of the graph."""
    rel, doc = parsed_header(ctx)
    if doc is None:
        return
    header_sha = ctx._npu_header_sha
    grel = ctx.graph_rel
    graph_sha = _graph_sha(ctx, grel)
    m = doc.get("model") or {}
    model = {k: m[k] for k in ("layers", "kv_heads", "head_size", "vocab_size", "num_heads", "hidden_size") if k in m}
    max_length = (doc.get("tiers") or {}).get("max_length")
    schedules: dict = {}
    old = []
    for stem, exts in sorted(metastate_sets(ctx.pkg).items()):
        mt = TIERED.match(stem.rsplit("/", 1)[-1])
        if not mt or "plan" not in exts or ctx.pkg.files[exts["plan"]].lfs:
            continue
        phase, tier, plan_rel = mt["phase"].lower(), int(mt["tier"]), exts["plan"]
        which = _PlanFile(plan_rel, phase, tier)
        try:
            raw = ctx.pkg.read_bytes(plan_rel, JSON_MAX_BYTES, "metastate plan")
        except ReadError as err:
            yield ctx.finding(plan_rel, str(err), err.hint)
            continue
        plan_sha = hashlib.sha256(raw).hexdigest()
        if "state" in exts and not ctx.pkg.files[exts["state"]].lfs:
            yield from _state_findings(ctx, exts["state"], which, plan_sha, (rel, header_sha), (grel, graph_sha))
        try:
            plan = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
            yield ctx.finding(plan_rel, f"is not valid JSON ({err})", "rebuild the package")
            continue
        if plans.version_problem(plan) is not None:
            old.append((plan_rel, plan))
            continue
        errs = _schema_errors("metastate_plan", plan_sha, plan)
        for pointer, message in errs[:10]:
            yield ctx.finding(plan_rel, message, "rebuild the package; plans are written by raipack fuse", pointer)
        if errs:
            continue
        node = mt["node"]
        if (phase, node) not in schedules:
            schedules[(phase, node)] = sched = _schedule(ctx, phase, node)
            if isinstance(sched, list):
                yield from sched
        sched = schedules[(phase, node)]
        if isinstance(sched, list):
            continue  # the schedule's own findings say why its plans cannot be checked
        yield from _plan_findings(ctx, which, plan, sched, model, max_length)
    if old:
        plan_rel, plan = old[0]
        yield ctx.finding(plan_rel, plans.version_problem(plan, len(old) - 1), plans.VERSION_HINT, "/format_version")


def _schedule(ctx, phase: str, node: str):
    """(file name, sha256, prepared schedule) of a phase's shared schedule, or the findings that
    say why it cannot be used."""
    srel = plans.schedule_rel(node, phase)
    fe = ctx.pkg.files.get(srel)
    if fe is None:
        return [ctx.finding(srel, f"is missing: the {phase} plans of node {node} share its schedule", "copy the whole cache folder, or rebuild the package")]
    if fe.lfs:
        return []
    try:
        raw = ctx.pkg.read_bytes(srel, JSON_MAX_BYTES, "metastate schedule")
    except ReadError as err:
        return [ctx.finding(srel, str(err), err.hint)]
    sha = hashlib.sha256(raw).hexdigest()
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        return [ctx.finding(srel, f"is not valid JSON ({err})", "rebuild the package")]
    errs = _schema_errors("metastate_schedule", sha, doc) or plans.schedule_problems(doc, phase=phase, node=node)
    if errs:
        return [ctx.finding(srel, message, "rebuild the package; schedules are written by raipack fuse", pointer) for pointer, message in errs[:10]]
    return srel, sha, plans.Schedule(doc)


def _plan_findings(ctx, which: _PlanFile, plan, sched, model, max_length):
    """One plan against its schedule file (name and sha256) and the schedule's contents."""
    plan_rel, phase, tier = which
    srel, sha, prepared = sched
    ref = plan["schedule"]
    if ref["file"] != srel:
        yield ctx.finding(plan_rel, f"names the schedule {ref['file']!r}; expected {srel!r}", "rebuild the package", "/schedule/file")
    elif ref["sha256"] != sha:
        yield ctx.finding(plan_rel, f"records another sha256 for {srel} (the schedule was edited, swapped or comes from another build)", "rebuild the package", "/schedule/sha256")
    else:
        for pointer, message in plans.plan_problems(plan, prepared, phase=phase, tier=tier, model=model, max_length=max_length):
            yield ctx.finding(plan_rel, message, "rebuild the package", pointer)


@check("RP906", "tier-options")
def tier_options(ctx):
    """In a raipack package, the provider options and search settings agree
    with the tiers the package holds: `search.max_length` is the largest
    token tier (and `max_length_for_kv_cache`, when set, equals it);
    `hybrid_opt_max_seq_length` is the largest prefill tier (1.8) or, when
    prefill is chunked, the power of two holding `chunk_size` (what `raipack
    tune --chunk-size` writes), or the largest power of two within
    `max_length` (1.7.1 16K); `chunk_size`
    is a prefill tier; chunked prefill (`hybrid_opt_chunk_context` "1") is on
    whenever `rai_config.max_prompt_length` exceeds the largest prefill tier;
    the header's tiers are the profile's prefill tiers up to `max_length`, and
    its token tiers below `max_length` and `max_length` itself. A hybrid
    layout (a profile without tiers: decode on the iGPU) lists no tiers, its
    header's `max_length` is `search.max_length` (one KV buffer), and
    `hybrid_opt_max_seq_length` is the largest power of two within the
    layout's `prefill_pass` and `max_length`, which no
    `max_prompt_length` exceeds."""
    rel, doc = parsed_header(ctx)
    if doc is None:
        return
    L = ctx.settings.as_dict()
    t = doc.get("tiers") or {}
    prefill, token = sorted(t.get("prefill") or []), sorted(t.get("token") or [])
    if tierless(ctx.profile):
        yield from _tierless_options(ctx, rel, t, L)
        return
    if not prefill or not token:
        yield ctx.finding(rel, "lists no prefill or no token tiers", "rebuild the package", "/tiers")
        return
    opts, where = ctx.options
    ml = L["max_length"]
    if ml != token[-1] or t.get("max_length") != ml:
        yield ctx.finding(GENAI, f"search.max_length is {ml}, but the package's largest token tier is {token[-1]} (header max_length {t.get('max_length')})", "rebuild the package; the static KV buffer is sized by the largest token tier", "/search/max_length")
    if L["kv_cache"] is not None and L["kv_cache"] != token[-1]:
        yield ctx.finding(GENAI, f"max_length_for_kv_cache is {L['kv_cache']}, but the largest token tier is {token[-1]}", "set it to the largest token tier", where.get("max_length_for_kv_cache", ""))
    rule = ctx.profile.genai.options.get("hybrid_opt_max_seq_length")
    built = rule.build if rule is not None and rule.build is not None else "{npu_seq}"
    want, what = (pow2_floor(token[-1]), "the largest power of two within max_length") if built == "{max_length_pow2}" else (prefill[-1], "the largest prefill tier")
    chunk = L["chunk_size"] if L["chunked"] else None
    tuned = min(pow2_ceil(chunk), prefill[-1]) if chunk and chunk in prefill and built != "{max_length_pow2}" else want
    if L["npu_seq"] is not None and L["npu_seq"] not in (want, tuned):
        also = f" (or {tuned}, the power of two holding the {chunk}-token chunks)" if tuned != want else ""
        yield ctx.finding(GENAI, f"hybrid_opt_max_seq_length is {L['npu_seq']}, but profile {ctx.profile.id} sets it to {what}, {want}{also}", f"set it to {want}", where.get("hybrid_opt_max_seq_length", ""))
    if L["chunk_size"] is not None and L["chunk_size"] not in prefill:
        yield ctx.finding(GENAI, f"search.chunk_size {L['chunk_size']} is not one of the prefill tiers {prefill}", "make chunk_size a prefill tier", "/search/chunk_size")
    too_long = {v: n for v, n in L["max_prompt"].items() if n > prefill[-1]}
    if too_long and not L["chunked"]:
        v, n = sorted(too_long.items())[0]
        yield ctx.finding("rai_config.json", f"max_prompt_length for {v} is {n}, above the largest prefill tier {prefill[-1]}, with chunked prefill off", "turn on hybrid_opt_chunk_context or lower max_prompt_length", f"/max_prompt_length/{v}")
    declared = ctx.profile.buckets
    if ml:
        for key, have in (("prefill", prefill), ("token", token)):
            want = expected_tiers(declared.of(key), key, ml)
            if declared.of(key) and have != want:
                yield ctx.finding(rel, f"lists {key} tiers {have}; profile {ctx.profile.id} declares {want} up to max_length {ml}", "rebuild the package with the right profile", f"/tiers/{key}")


def _tierless_options(ctx, rel: str, t: dict, L: dict):
    """RP906 for a layout without tiers (hybrid)."""
    if t.get("prefill") or t.get("token"):
        yield ctx.finding(rel, f"lists tiers, but profile {ctx.profile.id} has none (its decode runs on the iGPU over one KV buffer)", "rebuild the package with the right profile", "/tiers")
    opts, where = ctx.options
    ml = L["max_length"]
    if ml is None or t.get("max_length") != ml:
        yield ctx.finding(GENAI, f"search.max_length is {ml}, but the header says the package was built for {t.get('max_length')}", "rebuild the package; do not edit max_length by hand", "/search/max_length")
        return
    want = pow2_floor(min(ctx.profile.layout.prefill_pass or ml, ml))
    if L["npu_seq"] is not None and L["npu_seq"] != want:
        yield ctx.finding(GENAI, f"hybrid_opt_max_seq_length is {L['npu_seq']}, but profile {ctx.profile.id} sets it to the largest power of two within its prefill pass and max_length, {want}",
                          f"set it to {want}", where.get("hybrid_opt_max_seq_length", ""))
    for v, n in sorted(L["max_prompt"].items()):
        if n > want:
            yield ctx.finding("rai_config.json", f"max_prompt_length for {v} is {n}, above the {want} tokens one NPU prefill pass takes", f"lower it to {want}", f"/max_prompt_length/{v}")
            break


@check("RP907", "cpu-fallback", "warning")
def cpu_fallback(ctx):
    """A raipack package lists in its header the graph nodes that are not
    part of a fused NPU operator although they belong to the decoder layers
    (anything besides embedding, mask arithmetic, final norm and lm_head):
    each one runs on the CPU and is reported, never silently."""
    rel, doc = parsed_header(ctx)
    if doc is None:
        return
    for n in doc.get("cpu_nodes") or []:
        if isinstance(n, dict) and n.get("why") == "not fused":
            yield ctx.finding(ctx.graph_rel or "model.onnx", f"{n.get('op_type')} node {n.get('name')} is not fused and runs on the CPU", "see the fuse report for the NPU constraint it breaks", str(n.get("name")))
