"""dd_metastate plans, format version 2: what every tier of a phase shares is stored once, in a
schedule file; each tier's `.plan` keeps only what varies (docs/formats.md).

    cache/<node>_<phase>.schedule.json   the steps, every activation's dtype and symbolic shape
                                         (integers, "S" = sequence_length, "T" = kv_window), the
                                         arena's buffers (name, lifetime) in a fixed order, the KV
                                         bindings' tensor names
    dd_metastate_Llm_<Phase>_<node>_<L>.plan
                                         the tier's lengths, the schedule's file name and sha256,
                                         scratch bytes per step, the arena's size and every buffer's
                                         offset and size (in the schedule's order), the KV binding

The fuse stage derives the symbolic shapes from two runs of its shape inference at probe lengths
(`derive_schedule`) instead of one run per tier; the checks and the runtime prepare a schedule once
(`Schedule`) and check each tier against it in a few milliseconds (`plan_problems`).
Standard library only, so the light install reads and checks plans without numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from raipack.npu.arena import activation_buffers, first_fit, live_pairs
from raipack.npu.formats import DTYPE_SIZE, PLAN_ALIGNMENT, PLAN_FORMAT, FormatError, align, nbytes

PLAN_VERSION = 2  # plans and schedules; the header, .state and .const keep formats.FORMAT_VERSION
SCHEDULE_FORMAT = "raipack-metastate-schedule"
SYMBOLS = {"S": 0, "T": 1}  # sequence_length, kv_window
# (S, T) pairs the schedule of a phase is derived at: distinct from each other and from small constants
PROBES = {"prefill": ((7, 11), (13, 17)), "token": ((1, 11), (1, 17))}
STEP_KEYS = ("node", "op_type", "device", "inputs", "outputs")
KV_BINDING = "past_present_shared"
MAX_INT = 2**62
BUG = "this is a raipack bug; please report it"


def schedule_rel(node: str, phase: str) -> str:
    """The schedule file a phase's plans name (not a dd_metastate_* file, not a cache meta file)."""
    return f"cache/{node}_{phase}.schedule.json"


def _count(x) -> bool:
    return type(x) is int and 0 <= x < MAX_INT


# ----------------------------------------------------------------------------- building


def _dim(a: int, b: int, pa, pb):
    """One dimension seen at two probes: a constant, "S", "T", or None."""
    if a == b:
        return a
    return next((sym for sym, k in SYMBOLS.items() if a == pa[k] and b == pb[k]), None)


def _product(a: int, b: int, pa, pb):
    """Bytes seen at two probes as [c, *symbols] (c times the symbols' product), or None."""
    for syms in ((), ("S",), ("T",), ("S", "T")):
        da, db = (math.prod(p[SYMBOLS[s]] for s in syms) for p in (pa, pb))
        if a % da == 0 and b % db == 0 and a // da == b // db:
            return [a // da, *syms]
    return None


def derive_schedule(*, phase: str, node: str, probes, io: dict, weights: set) -> dict:
    """The schedule document of a phase from two runs of the shape inference: `probes` is
    [((S, T), steps, info), ((S, T), steps, info)] at distinct lengths. A shape that is neither
    constant nor S nor T is refused (FormatError: the plan cannot be shared)."""
    (pa, steps_a, info_a), (pb, steps_b, info_b) = probes
    if [[s[k] for k in STEP_KEYS] for s in steps_a] != [[s[k] for k in STEP_KEYS] for s in steps_b]:
        raise FormatError(f"the {phase} steps differ between (S, T) = {pa} and {pb}", BUG)
    tensors = {}
    for name, (dtype, shape) in info_a.items():
        if name in weights:
            continue
        dtype_b, shape_b = info_b[name]
        dims = [_dim(a, b, pa, pb) for a, b in zip(shape, shape_b)] if (dtype, len(shape)) == (dtype_b, len(shape_b)) else [None]
        if None in dims:
            raise FormatError(f"tensor {name} is {dtype} {shape} at (S, T) = {pa} but {dtype_b} {shape_b} at {pb}: a dimension is neither constant nor S nor T", BUG)
        tensors[name] = {"dtype": dtype, "shape": dims}
    steps = []
    for sa, sb in zip(steps_a, steps_b):
        step = {k: sa[k] for k in STEP_KEYS}
        if sa["scratch"] or sb["scratch"]:
            step["scratch"] = _product(sa["scratch"], sb["scratch"], pa, pb)
            if step["scratch"] is None:
                raise FormatError(f"the scratch bytes of {sa['node']} ({sa['scratch']} at {pa}, {sb['scratch']} at {pb}) are not a constant times S and/or T", BUG)
        steps.append(step)
    kv = [{"layer": layer, "kind": kind, "past": past, "present": present}
          for layer, (pair, new) in enumerate(zip(io["past"], io["present"]))
          for kind, past, present in (("key", pair[0], new[0]), ("value", pair[1], new[1]))]
    return {"format": SCHEDULE_FORMAT, "format_version": PLAN_VERSION, "node": node, "phase": phase,
            "steps": steps, "tensors": tensors, "buffers": activation_buffers(steps, tensors, io), "kv": kv}


# ----------------------------------------------------------------------------- a prepared schedule


def _factors(dims, unit: int = 1) -> tuple[int, int, int]:
    """(constant, power of S, power of T) of a product of integers and symbols."""
    c, p = unit, [0, 0]
    for d in dims:
        if isinstance(d, str):
            p[SYMBOLS[d]] += 1
        else:
            c *= d
    return c, p[0], p[1]


class Schedule:
    """A schedule document (checked by `schedule_problems` first) prepared once for many tiers:
    each buffer's lifetime and size factors, and the pairs of buffers live at the same step."""

    def __init__(self, doc: dict):
        self.doc, steps, self.tensors = doc, doc["steps"], doc["tensors"]
        buffers = doc["buffers"]
        self.names = [b["name"] for b in buffers]
        self.first = [b["first_step"] for b in buffers]
        self.scratch = [(k, _factors(s["scratch"])) for k, s in enumerate(steps, start=1) if "scratch" in s]
        scratch = dict(self.scratch)
        self.factors = [_factors(self.tensors[b["name"]]["shape"], DTYPE_SIZE[self.tensors[b["name"]]["dtype"]])
                        if b["name"] in self.tensors else scratch[b["first_step"]] for b in buffers]
        self.pairs = live_pairs(self.first, [b["last_step"] for b in buffers])
        self.neighbors: list[list[int]] = [[] for _ in buffers]
        for i, j in self.pairs:
            self.neighbors[i].append(j)
            self.neighbors[j].append(i)
        self._sizes: dict = {}

    def sizes_at(self, S: int, T: int) -> list[int]:
        """Bytes each buffer needs at (S, T)."""
        if (S, T) not in self._sizes:
            if len(self._sizes) > 256:
                self._sizes.clear()
            self._sizes[(S, T)] = [c * S**a * T**b for c, a, b in self.factors]
        return self._sizes[(S, T)]

    def shape_at(self, name: str, S: int, T: int) -> list[int]:
        return [(S, T)[SYMBOLS[d]] if isinstance(d, str) else d for d in self.tensors[name]["shape"]]

    def scratch_at(self, S: int, T: int) -> list[list[int]]:
        """[step, bytes] of every step with scratch at (S, T)."""
        return [[k, c * S**a * T**b] for k, (c, a, b) in self.scratch if c * S**a * T**b]

    def overlaps(self, offsets: list[int], sizes: list[int]) -> list[tuple[int, int]]:
        """Pairs of non-empty buffers live at the same step whose bytes intersect (pure Python: at
        Llama-3.1-8B's 32 layers, 245 buffers and 1295 live pairs, ~0.05 ms a tier, as numpy took
        without its import)."""
        o, z = offsets, sizes
        e = [a + b for a, b in zip(o, z)]
        return [(i, j) for i, j in self.pairs if o[i] < e[j] and o[j] < e[i] and z[i] and z[j]]


@dataclass(frozen=True)
class PlanTarget:
    """What every tier's plan of one package shares."""

    max_length: int  # the KV buffer's positions
    model: dict  # layers, kv_heads, head_size, vocab_size
    io: dict  # graph input and logits names
    kv_dtype: str = "float32"


def tier_plan(sched: Schedule, schedule: dict, target: PlanTarget, *, tier: int, seq: int, window: int) -> dict:
    """The plan of one tier: `seq` positions over a KV window of `window`. `schedule` is
    {"file", "sha256"} of the schedule file."""
    max_length, model, io, kv_dtype = target.max_length, target.model, target.io, target.kv_dtype
    sizes = sched.sizes_at(seq, window)
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], sched.first[i], sched.names[i]))
    offsets = first_fit(sizes, order, sched.neighbors, PLAN_ALIGNMENT)
    kvh, hs = model["kv_heads"], model["head_size"]
    region = max_length * kvh * hs * DTYPE_SIZE[kv_dtype]
    shape = [1, kvh, window, hs]
    doc = sched.doc
    return {
        "format": PLAN_FORMAT, "format_version": PLAN_VERSION, "node": doc["node"], "phase": doc["phase"], "tier": tier,
        "sequence_length": seq, "kv_window": window, "max_length": max_length, "model": model, "io": io,
        "schedule": schedule,
        "scratch": sched.scratch_at(seq, window),
        "arena": {"alignment": PLAN_ALIGNMENT, "size": align(max((o + s for o, s in zip(offsets, sizes)), default=0), PLAN_ALIGNMENT),
                  "offsets": offsets, "sizes": sizes},
        "kv_cache": {"binding": KV_BINDING, "dtype": kv_dtype, "max_length": max_length, "window": window, "region_bytes": region,
                     "total_bytes": len(doc["kv"]) * region, "shape": shape, "bytes": nbytes(kv_dtype, shape),
                     "offsets": [k * region for k in range(len(doc["kv"]))]},
    }


def kv_bindings(plan: dict, sched: Schedule) -> list[dict]:
    """Each KV binding of a (checked) plan: past and present names, byte offset, shape, bytes."""
    kv = plan["kv_cache"]
    return [{**names, "offset": off, "shape": kv["shape"], "bytes": kv["bytes"]} for names, off in zip(sched.doc["kv"], kv["offsets"])]


# ----------------------------------------------------------------------------- checking


def version_problem(plan, more: int = 0) -> str | None:
    """The one sentence for a plan of another format version (None when it is version 2 or no plan
    at all); `more`: how many other plans of the package are the same."""
    if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT or plan.get("format_version") == PLAN_VERSION:
        return None
    v = plan.get("format_version")
    also = f" (as are {more} more plans)" if more else ""
    if isinstance(v, int) and not isinstance(v, bool) and v < PLAN_VERSION:
        return f"is a version {v} plan{also}, written by an older raipack; this raipack reads version {PLAN_VERSION} plans (one shared schedule per phase), so the package must be rebuilt"
    return f"has plan format_version {v!r}{also}; this raipack reads version {PLAN_VERSION}"


VERSION_HINT = "rebuild the package with `raipack build`"


def schedule_problems(doc: dict, *, phase: str | None = None, node: str | None = None) -> list[tuple[str, str]]:
    """(JSON pointer, sentence) for every inconsistency of a schedule document."""
    out: list[tuple[str, str]] = []
    try:
        if doc["format"] != SCHEDULE_FORMAT or doc["format_version"] != PLAN_VERSION:
            out.append(("/format_version", f"is {doc['format']!r} version {doc['format_version']!r}; this raipack reads {SCHEDULE_FORMAT} version {PLAN_VERSION}"))
            return out
        for key, want in (("phase", phase), ("node", node)):
            if want is not None and doc[key] != want:
                out.append((f"/{key}", f"{key} is {doc[key]!r} but the file name says {want!r}"))
        steps, tensors = doc["steps"], doc["tensors"]
        for name, t in tensors.items():
            if t["dtype"] not in DTYPE_SIZE or not all(d in SYMBOLS if isinstance(d, str) else _count(d) for d in t["shape"]):
                out.append((f"/tensors/{name}", f"tensor {name} is {t['dtype']!r} {t['shape']}; expected a known dtype and dimensions that are integers, \"S\" or \"T\""))
        for k, s in enumerate(steps):
            f = s.get("scratch", [0])
            if not (f and _count(f[0]) and all(x in SYMBOLS for x in f[1:])):
                out.append((f"/steps/{k}/scratch", f"step {k + 1} has scratch {f!r}; expected [bytes, then \"S\" and/or \"T\"]"))
        _buffer_problems(out, doc["buffers"], steps, tensors)
        for k, b in enumerate(doc["kv"]):
            if b["past"] not in tensors:
                out.append((f"/kv/{k}/past", f"KV binding {k} names {b['past']}, which is not a tensor of the schedule"))
    except (KeyError, TypeError, AttributeError, IndexError) as err:
        out.append(("", f"the schedule lacks or mistypes a field ({err!r}); it does not follow {SCHEDULE_FORMAT} version {PLAN_VERSION}"))
    return out


def _buffer_problems(out: list, buffers: list, steps: list, tensors: dict) -> None:
    n, seen = len(steps), set()
    for k, b in enumerate(buffers):
        name, f, last = b["name"], b["first_step"], b["last_step"]
        if not (_count(f) and _count(last) and f <= last <= n + 1):
            out.append((f"/buffers/{k}", f"buffer {name} has lifetime [{f}, {last}] outside the {n} steps"))
        elif name not in tensors and not (f == last and 1 <= f <= n and "scratch" in steps[f - 1] and name == f"{steps[f - 1]['node']}/scratch"):
            out.append((f"/buffers/{k}/name", f"buffer {name} is neither a tensor of the schedule nor the scratch of its step"))
        if name in seen:
            out.append((f"/buffers/{k}/name", f"buffer {name} is listed twice"))
        seen.add(name)


def plan_problems(plan: dict, sched: Schedule, *, phase: str | None = None, tier: int | None = None, model: dict | None = None,
                  max_length: int | None = None) -> list[tuple[str, str]]:
    """(JSON pointer, sentence) for every inconsistency of a version 2 plan with itself and its
    (checked) schedule; `phase`, `tier`, `model` (layers, kv_heads, head_size, vocab_size) and
    `max_length` are what the file name and the package say it must match."""
    out: list[tuple[str, str]] = []
    # each part appends to `out` as it goes, so a field missing halfway keeps what was found before it
    try:
        S, T, L = plan["sequence_length"], plan["kv_window"], plan["tier"]
        if not all(_count(x) and x > 0 for x in (S, T, L)):
            return [("/tier", f"tier {L!r}, sequence_length {S!r} and kv_window {T!r} must be positive integers")]
        _length_problems(out, plan, phase=phase, tier=tier, max_length=max_length)
        m = plan["model"]
        for key, value in (model or {}).items():
            if key in m and m[key] != value:
                out.append((f"/model/{key}", f"{key} is {m[key]} in the plan but {value} in the package"))
        for key in ("phase", "node"):
            if plan[key] != sched.doc[key]:
                out.append(("/schedule/file", f"the plan is for {key} {plan[key]!r} but its schedule is for {sched.doc[key]!r}"))
        _io_problems(out, plan, sched)
        if plan["scratch"] != sched.scratch_at(S, T):
            out.append(("/scratch", f"the scratch bytes per step are not those of the schedule at tier {L}"))
        _arena_problems(out, plan["arena"], sched, S, T)
        _kv_problems(out, plan, sched)
    except (KeyError, TypeError, AttributeError, IndexError, ValueError, OverflowError) as err:
        out.append(("", f"the plan lacks or mistypes a field ({err!r}); it does not follow {PLAN_FORMAT} version {PLAN_VERSION}"))
    return out


def _positions(plan: dict) -> tuple[int, int, int]:
    """(sequence length, KV window, tier) of a plan whose three are checked positive integers."""
    return plan["sequence_length"], plan["kv_window"], plan["tier"]


def _length_problems(out: list, plan: dict, *, phase, tier, max_length) -> None:
    """Phase, tier, sequence length, KV window and max_length against each other and the file name."""
    S, T, L = _positions(plan)
    if phase and plan["phase"] != phase:
        out.append(("/phase", f"phase is {plan['phase']!r} but the file name says {phase!r}"))
    if tier is not None and L != tier:
        out.append(("/tier", f"tier is {L} but the file name says {tier}"))
    if plan["phase"] == "prefill" and S != L:
        out.append(("/sequence_length", f"a prefill plan of tier {L} runs {S} positions; expected {L}"))
    if plan["phase"] == "token" and (S != 1 or T != L):
        out.append(("/kv_window", f"a token plan of tier {L} must run 1 position over a {L}-position window; it says {S} over {T}"))
    if T < S:
        out.append(("/kv_window", f"the KV window {T} is shorter than the {S} positions of one call"))
    ml = max_length if max_length is not None else plan.get("max_length")
    if ml is not None and (T > ml or plan.get("max_length") != ml):
        out.append(("/max_length", f"the plan is for max_length {plan.get('max_length')} with a {T}-position window; the package's max_length is {ml}"))


def _io_problems(out: list, plan: dict, sched: Schedule) -> None:
    """The graph inputs and logits at this tier."""
    (S, T, L), m = _positions(plan), plan["model"]
    io = plan["io"]
    want = {"input_ids": [1, S], "attention_mask": [1, T], "logits": [1, 1, m["vocab_size"]]}
    for key, shape in want.items():
        name = io.get(key)
        if name not in sched.tensors:
            out.append((f"/io/{key}", f"the schedule has no tensor for {key} ({name!r})"))
        elif sched.shape_at(name, S, T) != shape:
            out.append((f"/io/{key}", f"{key} is {sched.shape_at(name, S, T)} at tier {L}; expected {shape}"))


def _arena_problems(out: list, arena: dict, sched: Schedule, S, T) -> None:
    """The arena: one offset and size per buffer, aligned, in bounds, big enough, no two live buffers sharing bytes."""
    size, a, offsets, sizes = arena["size"], arena["alignment"], arena["offsets"], arena["sizes"]
    n = len(sched.names)
    if not (_count(size) and _count(a) and a > 0 and all(map(_count, offsets)) and all(map(_count, sizes))):
        out.append(("/arena", "the arena's size, alignment, offsets and sizes must be non-negative integers"))
        return
    if len(offsets) != n or len(sizes) != n:
        out.append(("/arena", f"the arena gives {len(offsets)} offsets and {len(sizes)} sizes; the schedule has {n} buffers"))
        return
    need = sched.sizes_at(S, T)
    for k, (o, z, want) in enumerate(zip(offsets, sizes, need)):
        if o % a:
            out.append((f"/arena/offsets/{k}", f"buffer {sched.names[k]} starts at {o}, not a multiple of {a}"))
        if o + z > size:
            out.append((f"/arena/sizes/{k}", f"buffer {sched.names[k]} ends at {o + z}, past the {size}-byte arena"))
        if z < want:
            out.append((f"/arena/sizes/{k}", f"buffer {sched.names[k]} is {z} bytes, smaller than the {want} bytes it needs at this tier"))
    for i, j in sched.overlaps(offsets, sizes)[:10]:
        x, y = sorted((i, j), key=offsets.__getitem__)
        out.append(("/arena/offsets", f"buffers {sched.names[x]} and {sched.names[y]} are live together at step {max(sched.first[i], sched.first[j])} but overlap (bytes {offsets[y]}..{offsets[x] + sizes[x]})"))


def _kv_problems(out: list, plan: dict, sched: Schedule) -> None:
    """The KV cache binding: region size, window, one binding per layer and direction, disjoint regions."""
    (S, T, L), m = _positions(plan), plan["model"]
    kv, names = plan["kv_cache"], sched.doc["kv"]
    region = kv["max_length"] * m["kv_heads"] * m["head_size"] * DTYPE_SIZE[kv["dtype"]]
    if kv["region_bytes"] != region or kv["max_length"] != plan["max_length"]:
        out.append(("/kv_cache/region_bytes", f"region_bytes is {kv['region_bytes']}; {plan['max_length']} positions × {m['kv_heads']} heads × {m['head_size']} need {region}"))
    if kv["window"] != T:
        out.append(("/kv_cache/window", f"the KV binding's window is {kv['window']} but the plan's kv_window is {T}"))
    shape = [1, m["kv_heads"], T, m["head_size"]]
    if kv["shape"] != shape:
        out.append(("/kv_cache/shape", f"the KV bindings are {kv['shape']}; expected {shape} at tier {L}"))
    if kv["bytes"] != nbytes(kv["dtype"], shape) or kv["bytes"] > kv["region_bytes"]:
        out.append(("/kv_cache/bytes", f"a KV binding is {kv['bytes']} bytes, which does not fit its shape or its {kv['region_bytes']}-byte region"))
    if len(names) != 2 * m["layers"] or len(kv["offsets"]) != len(names):
        out.append(("/kv_cache/offsets", f"{len(kv['offsets'])} KV offsets and {len(names)} bindings for {m['layers']} layers; expected {2 * m['layers']}"))
    for k, b in enumerate(names):
        if sched.shape_at(b["past"], S, T) != shape:
            out.append((f"/kv_cache/offsets/{k}", f"{b['past']} is {sched.shape_at(b['past'], S, T)} at tier {L} but its KV binding is {shape}"))
    spans = sorted((off, off + kv["region_bytes"], b["past"]) for off, b in zip(kv["offsets"], names))
    for (_s1, e1, n1), (s2, _, n2) in zip(spans, spans[1:]):
        if e1 > s2:
            out.append(("/kv_cache/offsets", f"KV regions of {n1} and {n2} overlap"))
    if spans and (spans[0][0] < 0 or spans[-1][1] > kv["total_bytes"]):
        out.append(("/kv_cache/total_bytes", f"the KV regions end at {spans[-1][1]}, past total_bytes {kv['total_bytes']}"))
