"""raipack reference packages: the open NPU formats (model.pb.bin + model.bin, cache descriptors,
dd_metastate plans) agree with each other, with the graph and with the provider options.

The checks run on a package whose NPU header starts with raipack's magic (`RAIPKNPU`) and on every
package that says raipack built it (a reference profile, detected from manifest.json or chosen),
where a header without the magic, or one that does not parse, is an RP901 error that says why
RP902–RP907 could not run. AMD's packages use AMD's own undocumented formats, so elsewhere these
checks are no-ops. They read the header, the graph without weights, the cache meta/descriptor
files and the plans (small files); only RP902 reads model.bin, and only with --verify-hashes. The
formats are documented in docs/formats.md and implemented in pipeline/npu/formats.py (standard
library only at import time).
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from raipack.checks.base import check
from raipack.core.package import JSON_MAX_BYTES, ReadError
from raipack.npu.constraints import NpuConstraints, placed_as_header_says, stored_in
from raipack.npu.detect import built_by_raipack
from raipack.npu.layout import TIERED, metastate_sets, weights_sibling
from raipack.npu.settings import expected_tiers, pow2_ceil, pow2_floor, tierless
from raipack.npu.target import Target

GENAI = "genai_config.json"
FUSED_DOMAIN = "ai.raipack"


def _formats():
    from raipack.npu import formats

    return formats


def _header_rel(ctx) -> str:
    opts, _ = ctx.options
    name = opts.get("external_data_file")
    return name if isinstance(name, str) and name else "model.pb.bin"


def _raipack_claim(ctx) -> str | None:
    """Why this package must have a raipack header (None when nothing says raipack built it)."""

    found = built_by_raipack(ctx.pkg)
    if found is not None:
        return f"manifest.json says raipack built this package for {found.profile.extends or found.profile.id}"
    if ctx.profile.target is Target.REFERENCE:
        return f"it is checked as raipack's reference profile {ctx.profile.id}"
    return None


def _reference(ctx):
    """(header rel path, parsed header or FormatError) when this is a raipack reference package, else None.

    A package that says raipack built it gets a FormatError for a header without raipack's magic
    (AMD's, damaged, empty): it must carry raipack's formats."""
    cached = getattr(ctx, "_npu_header", None)
    if cached is not None:
        return cached or None
    rel = _header_rel(ctx)
    fe = ctx.pkg.files.get(rel)
    result = False
    if fe is not None and not fe.lfs:  # a missing or pointer header is RP107 / RP404 / RP102's
        fmt = _formats()
        head, data = _read_header_file(ctx, rel, fe.size)
        ctx._npu_magic = head == fmt.MAGIC
        if ctx._npu_magic:
            try:
                fmt.check_header_size(fe.size, rel)
                result = (rel, fmt.decode_header(data, rel))
                ctx._npu_header_sha = hashlib.sha256(data).hexdigest()  # RP904 and RP905 compare it
            except fmt.FormatError as err:
                result = (rel, err)
        elif (why := _raipack_claim(ctx)) is not None:
            result = (rel, fmt.FormatError(
                f"{rel} starts with {head!r}, not raipack's header magic {fmt.MAGIC!r}, but {why}, "
                "and a package raipack built must have raipack's header",
                f"rebuild the package with raipack build, or copy {rel} again from the package raipack wrote"))
    ctx._npu_header = result
    return result or None


def _read_header_file(ctx, rel: str, size: int) -> tuple[bytes, bytes]:
    """(magic-sized head, whole file) of the header, opened once: the whole file only when it starts
    with raipack's magic and is small enough to be a header (an AMD header is never read whole)."""
    fmt = _formats()
    try:
        with ctx.pkg.open(rel) as fh:
            head = fh.read(len(fmt.MAGIC))
            if head != fmt.MAGIC or size > fmt.MAX_HEADER_FILE:
                return head, b""
            return head, head + fh.read(fmt.MAX_HEADER_FILE + 1 - len(head))
    except (OSError, ReadError):
        return b"", b""


def _small_file(ctx, rel: str) -> bytes:
    """A .state or .const file: the bytes the package scan read, else read once (ReadError when it cannot be)."""
    return ctx.pkg.scanned_bytes(rel, JSON_MAX_BYTES, "metastate file")


def _header(ctx):
    ref = _reference(ctx)
    if ref is None or not isinstance(ref[1], dict):
        return None, None
    return ref


@check("RP901", "npu-header")
def npu_header(ctx):
    """A raipack `model.pb.bin` parses (magic, version, length, the sha256 of
    its JSON document) and agrees with its weights file (`model.bin`): the
    recorded size, every tensor's offset (aligned to the header's alignment,
    4096), its size (dtype × shape), inside the file, no two tensors
    overlapping. Reads the header only. raipack writes a package's
    `manifest.json` last, so a reference header without one is an
    unfinished or altered package. A package that says raipack built it
    (its manifest, or a reference profile) must have such a header: one
    without the magic, truncated, of another version or with a broken
    JSON document is an error, as RP902–RP907 cannot check it."""
    ref = _reference(ctx)
    if ref is None:
        return
    rel, doc = ref
    if "manifest.json" not in ctx.pkg.files and ctx._npu_magic:  # without the magic, RP107 reports it
        yield ctx.finding("manifest.json", f"is missing, but {rel} is a raipack reference header: raipack writes the manifest last, so this package is unfinished or was altered",
                          "rebuild the package with raipack build, or copy it again with its manifest.json")
    fmt = _formats()
    if isinstance(doc, fmt.FormatError):
        yield ctx.finding(rel, f"{doc}; RP902–RP907 read this header, so they could not check the package",
                          doc.hint or "rebuild the package with raipack build", doc.pointer)
        return
    wrel = doc.get("weights_file", weights_sibling(rel))
    if wrel != weights_sibling(rel):
        yield ctx.finding(rel, f"names weights file {wrel!r}, but the runtime reads the sibling {weights_sibling(rel)!r}", "rebuild the package", "/weights_file")
    fe = ctx.pkg.files.get(wrel)
    if fe is None or fe.lfs:
        return  # RP404 / RP102 report a missing or pointer weights file
    for pointer, message in fmt.header_problems(doc, fe.size):
        yield ctx.finding(rel, message, "rebuild the package; model.bin and model.pb.bin must come from the same build", pointer)


@check("RP902", "npu-weights-hash", needs="verify_hashes")
def npu_weights_hash(ctx):
    """With `--verify-hashes`: every tensor of a raipack `model.bin` hashes to
    the sha256 that `model.pb.bin` records for it (a flipped byte, or a
    weights file from another build, is caught)."""
    rel, doc = _header(ctx)
    if doc is None:
        return
    fmt = _formats()
    wrel = doc.get("weights_file", weights_sibling(rel))
    fe = ctx.pkg.files.get(wrel)
    if fe is None or fe.lfs or fmt.header_problems(doc, fe.size):
        return  # RP901 says why the offsets cannot be trusted
    tensors = {t["name"]: t for _, _, _, t in fmt.header_tensors(doc)}
    path = ctx.pkg.path(wrel)

    def digest(t):
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            fh.seek(t["offset"])
            left = t["size"]
            while left:
                block = fh.read(min(left, 8 << 20))
                if not block:
                    break
                h.update(block)
                left -= len(block)
        return t["name"], h.hexdigest()

    with ThreadPoolExecutor(max_workers=max(1, ctx.jobs or 2)) as pool:
        results = dict(pool.map(digest, tensors.values()))
    bad = [n for n, h in results.items() if h != tensors[n]["sha256"]]
    for name in bad[:20]:
        t = tensors[name]
        yield ctx.finding(wrel, f"tensor {name} (bytes {t['offset']}..{t['offset'] + t['size']}) does not hash to the sha256 {rel} records", "the weights file is corrupt or from another build; copy or rebuild it", name)
    if len(bad) > 20:
        yield ctx.finding(wrel, f"{len(bad) - 20} more tensors do not match their sha256", "rebuild the package")


def _graph_model(ctx):
    g = ctx.graph
    return None if g is None or isinstance(g, Exception) else g


@check("RP903", "fused-graph")
def fused_graph(ctx):
    """In a raipack package, `model.onnx` and `model.pb.bin` describe the same
    fused nodes: every node of domain `ai.raipack` has its local function and
    a header operator of the same type, every initializer stored in
    `model.bin` has the header's offset, length and shape, and every
    `MatMulNBits` inside a fused node meets the profile's NPU constraints
    (bits, `quantization.allowed_group_sizes`, K/N multiples)."""
    rel, doc = _header(ctx)
    model = _graph_model(ctx)
    if doc is None or model is None:
        return
    from raipack.core import onnxproto as helper  # onnx's messages without onnx's import

    grel = ctx.graph_rel
    fmt = _formats()
    ops = {op.get("name"): op for op in doc.get("operators") or []}
    tensors = {t["name"]: t for _, _, _, t in fmt.header_tensors(doc)}
    functions = {f.name: f for f in model.functions if f.domain == FUSED_DOMAIN}
    limits = NpuConstraints.from_profile(ctx.profile)
    seen = set()
    for n in model.graph.node:
        if n.domain != FUSED_DOMAIN:
            continue
        seen.add(n.name)
        op = ops.get(n.name)
        if op is None:
            yield ctx.finding(grel, f"fused node {n.name} ({n.op_type}) has no operator in {rel}", "rebuild the package", n.name)
        elif op.get("op_type") != n.op_type:
            yield ctx.finding(grel, f"fused node {n.name} is {n.op_type} in the graph but {op.get('op_type')} in {rel}", "rebuild the package", n.name)
        fn = functions.get(n.op_type)
        if fn is None:
            yield ctx.finding(grel, f"fused node {n.name} uses {FUSED_DOMAIN}.{n.op_type}, but the model has no local function of that name", "rebuild the package; onnxruntime cannot run the node without its function", n.name)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        for inner in fn.node:
            if inner.op_type != "MatMulNBits":
                continue
            vals = {a.name: attrs.get(a.ref_attr_name) if a.ref_attr_name else helper.get_attribute_value(a) for a in inner.attribute}
            why = limits.matmul_problems(vals.get("bits", 4), vals.get("block_size"), vals.get("K"), vals.get("N"))
            if why:
                yield ctx.finding(grel, f"fused node {n.name}: its {inner.name} MatMulNBits breaks the NPU constraints of profile {ctx.profile.id}: " + ", ".join(why), "quantize with a group size the profile allows", n.name)
    for name in sorted(set(ops) - seen):
        yield ctx.finding(rel, f"lists operator {name}, which is not a node of {grel}", "rebuild the package", "/operators")
    wrel = doc.get("weights_file", "model.bin")
    for t, ext in stored_in(model.graph, wrel):
        entry = tensors.get(t.name)
        if entry is None:
            yield ctx.finding(grel, f"initializer {t.name} points into {wrel}, but {rel} does not list it", "rebuild the package", t.name)
        elif not placed_as_header_says(t, ext, entry):
            yield ctx.finding(grel, f"initializer {t.name} is at offset {ext.get('offset')} length {ext.get('length')} shape {list(t.dims)} in the graph but at {entry['offset']}, {entry['size']}, {entry.get('shape')} in {rel}", "rebuild the package; the graph and the header come from different builds", t.name)


@check("RP904", "fused-node-cache")
def fused_node_cache(ctx):
    """Every operator of a raipack `model.pb.bin` has its
    `cache/<node>_meta.json` and the `.const` descriptor it names; the
    descriptor parses, names the same node, records the header's sha256 and
    the same offsets and sizes for the node's tensors, as does the meta
    file's tensor map."""
    rel, doc = _header(ctx)
    if doc is None:
        return
    fmt = _formats()
    header_sha = ctx._npu_header_sha
    for i, op in enumerate(doc.get("operators") or []):
        name = op.get("name")
        meta_rel = op.get("meta") or f"cache/{name}_meta.json"
        if meta_rel not in ctx.pkg.files:
            yield ctx.finding(meta_rel, f"is missing: fused node {name} has no cache meta file", "copy the whole cache folder, or rebuild the package", f"/operators/{i}/meta")
            continue
        meta = ctx.pkg.try_json(meta_rel)
        if not isinstance(meta, dict):
            continue  # RP201/RP202 report it
        tmap = meta.get("tensor_map") if isinstance(meta.get("tensor_map"), dict) else {}
        desc = tmap.get("descriptor") if isinstance(tmap.get("descriptor"), dict) else None
        folder = meta_rel.rsplit("/", 1)[0]
        if desc is None or not isinstance(desc.get("file_name"), str):
            yield ctx.finding(meta_rel, f"has no descriptor entry in its tensor_map (fused node {name})", "rebuild the package", "/tensor_map/descriptor")
            continue
        const_rel = f"{folder}/{desc['file_name']}"
        if const_rel not in ctx.pkg.files:
            continue  # RP603 reports the missing .const
        try:
            d = fmt.decode_const(_small_file(ctx, const_rel), const_rel)
        except (fmt.FormatError, ValueError, ReadError) as err:
            yield ctx.finding(const_rel, str(err), "rebuild the package")
            continue
        if d.get("node") != name or d.get("op_type") != op.get("op_type"):
            yield ctx.finding(const_rel, f"describes {d.get('op_type')} {d.get('node')}, not {op.get('op_type')} {name}", "rebuild the package")
        if d.get("header_sha256") != header_sha:
            yield ctx.finding(const_rel, f"was written for another {rel} (its header_sha256 differs)", "rebuild the package; files of different builds were mixed")
        want = {t.get("role"): (t.get("offset"), t.get("size")) for t in op.get("tensors") or []}
        have = {t.get("role"): (t.get("offset"), t.get("size")) for t in d.get("tensors") or [] if isinstance(t, dict)}
        if have != want:
            yield ctx.finding(const_rel, f"lists tensors {sorted(have)} at other offsets or sizes than {rel} does for {name}", "rebuild the package")
        meta_t = {k: (v.get("offset"), v.get("size_in_bytes")) for k, v in tmap.items() if isinstance(v, dict) and "size_in_bytes" in v}
        if meta_t != want:
            yield ctx.finding(meta_rel, f"tensor_map places the tensors of {name} differently from {rel}", "rebuild the package", "/tensor_map")


_SCHEMA_ERRORS: dict[tuple[str, str], list] = {}


def _schema_errors(name: str, sha: str, doc: dict) -> list:
    """The schema errors of a plan or schedule, remembered by its sha256: a process that validates
    copies of a package sees each file again."""
    key = (name, sha)
    errs = _SCHEMA_ERRORS.get(key)
    if errs is None:
        from raipack.core import schemas

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
    fmt = _formats()
    (rel, header_sha), (grel, graph_sha) = header, graph
    try:
        state = fmt.decode_state(_small_file(ctx, srel), srel)
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
    rel, doc = _header(ctx)
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
        if _plans().version_problem(plan) is not None:
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
        yield ctx.finding(plan_rel, _plans().version_problem(plan, len(old) - 1), _plans().VERSION_HINT, "/format_version")


def _plans():
    from raipack.npu import plans

    return plans


def _schedule(ctx, phase: str, node: str):
    """(file name, sha256, prepared schedule) of a phase's shared schedule, or the findings that
    say why it cannot be used."""
    plans = _plans()
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
        for pointer, message in _plans().plan_problems(plan, prepared, phase=phase, tier=tier, model=model, max_length=max_length):
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
    rel, doc = _header(ctx)
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
    rel, doc = _header(ctx)
    if doc is None:
        return
    for n in doc.get("cpu_nodes") or []:
        if isinstance(n, dict) and n.get("why") == "not fused":
            yield ctx.finding(ctx.graph_rel or "model.onnx", f"{n.get('op_type')} node {n.get('name')} is not fused and runs on the CPU", "see the fuse report for the NPU constraint it breaks", str(n.get("name")))
