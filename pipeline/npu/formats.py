"""raipack's open binary formats for the reference package: `model.pb.bin` + `model.bin`, the
`dd_metastate_*` plan/state pair, and the `cache/<node>.const` descriptors.

This module imports only the standard library at load time (numpy is imported inside the functions
that need it), so `raipack validate` can read and check these files with the light base. Every
layout is described byte by byte in docs/formats.md; the constants below are the source of truth.

model.pb.bin (the header) — little-endian:

    0   8  magic  b"RAIPKNPU"
    8   4  uint32 format version (1)
    12  4  uint32 flags (0)
    16  8  uint64 n = length of the JSON document
    24  n  JSON document, UTF-8 (see docs/formats.md: operators → tensors → offset, size, dtype,
           shape, sha256)
    24+n 32 sha256 of the JSON bytes

model.bin (the weights) — the raw bytes of every tensor the header lists, each starting at a
multiple of `alignment` (4096) bytes, zero bytes in between; nothing else.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MAGIC = b"RAIPKNPU"
FORMAT_VERSION = 1
PREAMBLE = struct.Struct("<8sIIQ")
ALIGNMENT = 4096
HEADER_FORMAT = "raipack-npu-weights"
MAX_HEADER_JSON = 256 * 1024 * 1024

STATE_MAGIC = b"RAIPKMST"
STATE_PREAMBLE = struct.Struct("<8sIIQ")
PLAN_FORMAT = "raipack-metastate-plan"
PLAN_ALIGNMENT = 64

CONST_MAGIC = b"RAIPKCON"
CONST_PREAMBLE = struct.Struct("<8sIIQ")

DTYPE_SIZE = {"bool": 1, "uint8": 1, "int8": 1, "float16": 2, "bfloat16": 2, "float32": 4, "int32": 4, "int64": 8, "float64": 8, "uint4x2": 1}
# onnx.TensorProto data type codes → names (no onnx import needed)
ONNX_DTYPE = {1: "float32", 9: "bool", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 10: "float16", 11: "float64", 16: "bfloat16"}

MATMULNBITS_PACKING = (
    "com.microsoft.MatMulNBits layout, unchanged: B is uint8 [N, ceil(K/block), block*bits/8]; for output "
    "column n and input row k the 4-bit value is byte [n, k//block, (k%block)//2], low nibble when k is even, "
    "high nibble when odd; scales are float32 [N*ceil(K/block)] (row-major [N, blocks]); zero_points are uint8 "
    "[N*ceil(ceil(K/block)/2)], two 4-bit zero points per byte, low nibble first (default 8 when absent); "
    "w[k, n] = (q - zero_point) * scale"
)


class FormatError(Exception):
    """A reference-format file that cannot be used; str() is the sentence the user reads."""

    def __init__(self, message: str, hint: str = "", pointer: str = ""):
        super().__init__(message)
        self.hint = hint
        self.pointer = pointer


def align(n: int, a: int = ALIGNMENT) -> int:
    return (n + a - 1) // a * a


def nbytes(dtype: str, shape) -> int:
    return DTYPE_SIZE[dtype] * math.prod(int(d) for d in shape)


def sha256_hex(data) -> str:
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- the header


def encode_header(doc: dict) -> bytes:
    body = json.dumps(doc, indent=1, sort_keys=False).encode("utf-8")
    return PREAMBLE.pack(MAGIC, FORMAT_VERSION, 0, len(body)) + body + hashlib.sha256(body).digest()


def is_reference_header(path: Path) -> bool:
    """True when `path` starts with raipack's header magic (an AMD header does not)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def decode_header(data: bytes, name: str = "model.pb.bin") -> dict:
    if len(data) < PREAMBLE.size or data[:8] != MAGIC:
        raise FormatError(f"{name} does not start with raipack's header magic {MAGIC!r}", "rebuild the package with raipack build")
    magic, version, _flags, n = PREAMBLE.unpack_from(data)
    if version != FORMAT_VERSION:
        raise FormatError(f"{name} has header format version {version}; this raipack reads version {FORMAT_VERSION}", "rebuild the package, or use the raipack that built it")
    end = PREAMBLE.size + n
    if n > MAX_HEADER_JSON or len(data) != end + 32:
        raise FormatError(f"{name} is {len(data)} bytes but its preamble announces a {n}-byte JSON document ({end + 32} bytes in all): it is truncated or was edited", "rebuild the package")
    body = data[PREAMBLE.size:end]
    if hashlib.sha256(body).digest() != data[end:]:
        raise FormatError(f"{name}: the JSON document does not match the sha256 stored after it (the header was edited or corrupted)", "rebuild the package; never edit model.pb.bin by hand")
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FormatError(f"{name}: the JSON document cannot be parsed ({err})", "rebuild the package") from None
    if not isinstance(doc, dict) or doc.get("format") != HEADER_FORMAT:
        raise FormatError(f"{name}: the JSON document is not a {HEADER_FORMAT} header", "rebuild the package")
    return doc


def read_header(path: Path) -> dict:
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_HEADER_JSON + 64:
        raise FormatError(f"{path.name} is {size} bytes, too large for a header", "check that the header and weights files were not swapped")
    return decode_header(path.read_bytes(), path.name)


def header_tensors(doc: dict):
    """Yields (operator index, tensor index, operator, tensor entry) for every tensor reference."""
    for i, op in enumerate(doc.get("operators") or []):
        for j, t in enumerate(op.get("tensors") or []):
            yield i, j, op, t


def header_problems(doc: dict, weights_size: int | None) -> list[tuple[str, str]]:
    """(JSON pointer, sentence) for every inconsistency between the header and the weights file size:
    sizes against dtype × shape, alignment, bounds, overlaps, the same tensor listed twice differently."""
    out: list[tuple[str, str]] = []
    declared = doc.get("weights_size")
    a = doc.get("alignment")
    if not isinstance(a, int) or a <= 0 or a & (a - 1):
        out.append(("/alignment", f"alignment is {a!r}; expected a power of two such as {ALIGNMENT}"))
        a = ALIGNMENT
    if weights_size is not None and declared != weights_size:
        out.append(("/weights_size", f"the header records weights_size {declared} but {doc.get('weights_file', 'model.bin')} is {weights_size} bytes"))
    limit = weights_size if weights_size is not None else declared if isinstance(declared, int) else None
    spans: dict[str, tuple] = {}
    for i, j, op, t in header_tensors(doc):
        p = f"/operators/{i}/tensors/{j}"
        off, size, dtype, shape = t.get("offset"), t.get("size"), t.get("dtype"), t.get("shape")
        if not (isinstance(off, int) and isinstance(size, int) and off >= 0 and size >= 0):
            out.append((p, f"tensor {t.get('name')!r} of {op.get('name')} has no valid offset/size"))
            continue
        if off % a:
            out.append((p + "/offset", f"tensor {t.get('name')!r} of {op.get('name')} starts at {off}, not a multiple of the {a}-byte alignment"))
        if limit is not None and off + size > limit:
            out.append((p + "/size", f"tensor {t.get('name')!r} of {op.get('name')} ends at byte {off + size}, past the {limit}-byte weights file"))
        if dtype in DTYPE_SIZE and isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape):
            if nbytes(dtype, shape) != size:
                out.append((p + "/size", f"tensor {t.get('name')!r} is {size} bytes but {dtype} {shape} needs {nbytes(dtype, shape)}"))
        else:
            out.append((p, f"tensor {t.get('name')!r} has an unknown dtype {dtype!r} or a bad shape {shape!r}"))
        sha = t.get("sha256")
        if not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
            out.append((p + "/sha256", f"tensor {t.get('name')!r} has no sha256 (64 lowercase hex digits)"))
        key = t.get("name")
        span = (off, size, sha)
        if key in spans and spans[key] != span:
            out.append((p, f"tensor {key!r} is listed twice with different offset, size or sha256"))
        spans[key] = span
    ordered = sorted({(o, s, n) for n, (o, s, _) in spans.items() if isinstance(o, int) and isinstance(s, int)})
    for (o1, s1, n1), (o2, s2, n2) in zip(ordered, ordered[1:]):
        if o1 + s1 > o2 and s1 and s2:
            out.append(("/operators", f"tensors {n1!r} and {n2!r} overlap in the weights file (bytes {o2}..{o1 + s1})"))
    return out


class WeightsWriter:
    """Writes model.bin: appends tensors at `alignment`-byte boundaries and hashes them on a thread
    pool while the next one is written (hashlib and file writes both release the GIL)."""

    def __init__(self, path: Path, alignment: int = ALIGNMENT, workers: int = 2):
        self.path = Path(path)
        self.alignment = alignment
        self.fh = open(self.path, "wb")
        self.pos = 0
        self.entries: dict[str, dict] = {}
        self._futures = []
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers))

    def add(self, name: str, data, dtype: str, shape) -> dict:
        """`data` is a bytes-like object (a memoryview over the source file is never copied)."""
        if name in self.entries:
            return self.entries[name]
        mv = memoryview(data).cast("B")
        start = align(self.pos, self.alignment)
        if start != self.pos:
            self.fh.write(b"\0" * (start - self.pos))
        self.fh.write(mv)
        self.pos = start + mv.nbytes
        entry = {"name": name, "offset": start, "size": mv.nbytes, "dtype": dtype, "shape": [int(d) for d in shape], "sha256": ""}
        self.entries[name] = entry
        self._futures.append((entry, self._pool.submit(lambda m=mv: hashlib.sha256(m).hexdigest())))
        return entry

    def close(self) -> int:
        end = align(self.pos, self.alignment) if self.pos else 0
        if end != self.pos:
            self.fh.write(b"\0" * (end - self.pos))
            self.pos = end
        self.fh.close()
        for entry, fut in self._futures:
            entry["sha256"] = fut.result()
        self._pool.shutdown()
        return self.pos

    def abort(self):
        try:
            self.fh.close()
        finally:
            self._pool.shutdown(cancel_futures=True)


class WeightsFile:
    """model.bin read through model.pb.bin: sizes and offsets checked at open, sha256 per tensor
    checked at open (`verify="sha256"`) or never (`verify="sizes"`)."""

    def __init__(self, header_path: Path, verify: str = "sha256"):
        import mmap

        self.header_path = Path(header_path)
        self.header = read_header(self.header_path)
        wname = self.header.get("weights_file", "model.bin")
        if not isinstance(wname, str) or "/" in wname or "\\" in wname or wname.startswith("."):
            raise FormatError(f"{self.header_path.name} names weights file {wname!r}, which is not a file beside it", "rebuild the package")
        self.weights_path = self.header_path.with_name(wname)
        if not self.weights_path.is_file():
            raise FormatError(f"{wname} is missing: {self.header_path.name} indexes the NPU weights it should hold", "copy model.bin into the package")
        size = self.weights_path.stat().st_size
        problems = header_problems(self.header, size)
        if problems:
            pointer, msg = problems[0]
            raise FormatError(f"{self.header_path.name} and {wname} disagree: {msg}" + (f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""), "rebuild the package; the weights file does not belong to this header", pointer)
        self.tensors = {t["name"]: t for _, _, _, t in header_tensors(self.header)}
        with open(self.weights_path, "rb") as fh:
            self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        if verify == "sha256":
            bad = self.verify()
            if bad:
                raise FormatError(f"{wname}: {len(bad)} tensor(s) do not match the sha256 recorded in {self.header_path.name}, first {bad[0]!r}", "the weights file is corrupt or comes from another package; rebuild or re-download it")
        elif verify != "sizes":
            raise ValueError(f"verify must be 'sha256' or 'sizes', not {verify!r}")

    def verify(self, names=None, workers: int = 2) -> list[str]:
        """Names of tensors whose bytes do not hash to the header's sha256."""
        names = list(names or self.tensors)
        mv = memoryview(self._mm)

        def bad(name):
            t = self.tensors[name]
            return name if hashlib.sha256(mv[t["offset"]: t["offset"] + t["size"]]).hexdigest() != t["sha256"] else None

        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            return [n for n in pool.map(bad, names) if n]

    def array(self, name: str):
        """A read-only numpy view of one tensor (no copy)."""
        import numpy as np

        t = self.tensors[name]
        return np.frombuffer(self._mm, dtype=np.dtype(t["dtype"]), count=math.prod(t["shape"]), offset=t["offset"]).reshape(t["shape"])


# ----------------------------------------------------------------------------- metastate


def _encode_doc(magic: bytes, preamble, doc: dict) -> bytes:
    """magic, version, flags, n, then n bytes of JSON: the shape of .state and .const files."""
    body = json.dumps(doc, sort_keys=True).encode("utf-8")
    return preamble.pack(magic, FORMAT_VERSION, 0, len(body)) + body


def _decode_doc(magic: bytes, preamble, data: bytes, name: str, what: str) -> dict:
    if len(data) < preamble.size or data[:8] != magic:
        raise FormatError(f"{name} does not start with raipack's {what} magic {magic!r}", "rebuild the package")
    _, version, _, n = preamble.unpack_from(data)
    if version != FORMAT_VERSION or len(data) != preamble.size + n:
        raise FormatError(f"{name}: version {version} or length {len(data)} is not what its preamble announces", "rebuild the package")
    try:
        return json.loads(data[preamble.size:].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FormatError(f"{name}: the JSON document cannot be parsed ({err})", "rebuild the package") from None


def encode_state(doc: dict) -> bytes:
    return _encode_doc(STATE_MAGIC, STATE_PREAMBLE, doc)


def decode_state(data: bytes, name: str = "state") -> dict:
    return _decode_doc(STATE_MAGIC, STATE_PREAMBLE, data, name, "state")


def metastate_stem(phase: str, node: str, tier: int) -> str:
    return f"dd_metastate_Llm_{'Prefill' if phase == 'prefill' else 'Token'}_{node}_{tier}"


def assign_offsets(buffers: list[dict], alignment: int = PLAN_ALIGNMENT) -> int:
    """Greedy first-fit by decreasing size: sets `offset` on every buffer so that buffers whose
    [first_step, last_step] intervals intersect never share bytes. Returns the arena size."""
    placed: list[dict] = []
    for b in sorted(buffers, key=lambda b: (-b["size"], b["first_step"], b["name"])):
        busy = sorted((p["offset"], p["offset"] + p["size"]) for p in placed
                      if not (p["last_step"] < b["first_step"] or b["last_step"] < p["first_step"]))
        off = 0
        for s, e in busy:
            if off + b["size"] <= s:
                break
            off = max(off, align(e, alignment))
        b["offset"] = off
        placed.append(b)
    return align(max((b["offset"] + b["size"] for b in buffers), default=0), alignment)


def plan_problems(plan: dict, *, phase: str | None = None, tier: int | None = None, model: dict | None = None,
                  max_length: int | None = None) -> list[tuple[str, str]]:
    """(JSON pointer, sentence) for every internal inconsistency of a plan; `phase`, `tier`, `model`
    (layers, kv_heads, head_size, vocab_size) and `max_length` are what the file name and the
    package say it must match."""
    out: list[tuple[str, str]] = []
    # each part appends to `out` as it goes, so a field missing halfway keeps what was found before it
    try:
        S, T, L = plan["sequence_length"], plan["kv_window"], plan["tier"]
        _plan_shape_problems(out, plan, S, T, L, phase=phase, tier=tier, max_length=max_length)
        m = plan["model"]
        if model:
            for key, value in model.items():
                if key in m and m[key] != value:
                    out.append((f"/model/{key}", f"{key} is {m[key]} in the plan but {value} in the package"))
        tensors = plan["tensors"]
        _plan_tensor_problems(out, plan, tensors, m, S, T, L)
        _plan_arena_problems(out, plan, tensors)
        _plan_kv_problems(out, plan, tensors, m, T, L)
    except (KeyError, TypeError, AttributeError) as err:
        out.append(("", f"the plan lacks or mistypes a field ({err!r}); it does not follow {PLAN_FORMAT} version {FORMAT_VERSION}"))
    return out


def _plan_shape_problems(out: list, plan: dict, S, T, L, *, phase, tier, max_length) -> None:
    """Phase, tier, sequence length, KV window and max_length against each other and the file name."""
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


def _plan_tensor_problems(out: list, plan: dict, tensors: dict, m: dict, S, T, L) -> None:
    """Every tensor's bytes against its dtype and shape; the graph inputs and logits at this tier."""
    for name, t in tensors.items():
        if t["dtype"] not in DTYPE_SIZE:
            out.append((f"/tensors/{name}", f"tensor {name} has unknown dtype {t['dtype']!r}"))
        elif nbytes(t["dtype"], t["shape"]) != t["bytes"]:
            out.append((f"/tensors/{name}/bytes", f"tensor {name} is {t['dtype']} {t['shape']} ({nbytes(t['dtype'], t['shape'])} bytes) but the plan gives {t['bytes']} bytes"))
    io = plan["io"]
    want = {"input_ids": [1, S], "attention_mask": [1, T], "logits": [1, 1, m["vocab_size"]]}
    for key, shape in want.items():
        name = io.get(key)
        if name not in tensors:
            out.append((f"/io/{key}", f"the plan has no tensor for {key} ({name!r})"))
        elif tensors[name]["shape"] != shape:
            out.append((f"/tensors/{name}/shape", f"{key} is {tensors[name]['shape']} at tier {L}; expected {shape}"))


def _plan_arena_problems(out: list, plan: dict, tensors: dict) -> None:
    """The arena: bounds, alignment, no two live buffers sharing bytes."""
    arena = plan["arena"]
    size, a = arena["size"], arena["alignment"]
    steps = len(plan["schedule"])
    events: dict[int, list] = {}
    for k, b in enumerate(arena["buffers"]):
        p = f"/arena/buffers/{k}"
        if b["offset"] % a:
            out.append((p + "/offset", f"buffer {b['name']} starts at {b['offset']}, not a multiple of {a}"))
        if b["offset"] + b["size"] > size:
            out.append((p + "/size", f"buffer {b['name']} ends at {b['offset'] + b['size']}, past the {size}-byte arena"))
        if not 0 <= b["first_step"] <= b["last_step"] <= steps + 1:
            out.append((p, f"buffer {b['name']} has lifetime [{b['first_step']}, {b['last_step']}] outside the {steps} steps"))
        t = tensors.get(b["name"])
        if t is not None and b["size"] < t["bytes"]:
            out.append((p + "/size", f"buffer {b['name']} is {b['size']} bytes, smaller than its {t['bytes']}-byte tensor"))
        for s in range(max(0, b["first_step"]), min(steps + 1, b["last_step"]) + 1):
            events.setdefault(s, []).append(b)
    reported = set()
    for s, live in sorted(events.items()):
        live = sorted(live, key=lambda b: b["offset"])
        for x, y in zip(live, live[1:]):
            if x["offset"] + x["size"] > y["offset"] and x["size"] and y["size"] and (x["name"], y["name"]) not in reported:
                reported.add((x["name"], y["name"]))
                out.append(("/arena/buffers", f"buffers {x['name']} and {y['name']} are live together at step {s} but overlap (bytes {y['offset']}..{x['offset'] + x['size']})"))


def _plan_kv_problems(out: list, plan: dict, tensors: dict, m: dict, T, L) -> None:
    """The KV cache binding: region size, window, one binding per layer and direction, disjoint regions."""
    kv = plan["kv_cache"]
    region = kv["max_length"] * m["kv_heads"] * m["head_size"] * DTYPE_SIZE[kv["dtype"]]
    if kv["region_bytes"] != region:
        out.append(("/kv_cache/region_bytes", f"region_bytes is {kv['region_bytes']}; {kv['max_length']} positions × {m['kv_heads']} heads × {m['head_size']} need {region}"))
    if kv["window"] != T:
        out.append(("/kv_cache/window", f"the KV binding's window is {kv['window']} but the plan's kv_window is {T}"))
    if len(kv["bindings"]) != 2 * m["layers"]:
        out.append(("/kv_cache/bindings", f"{len(kv['bindings'])} KV bindings for {m['layers']} layers; expected {2 * m['layers']}"))
    spans = []
    for k, b in enumerate(kv["bindings"]):
        shape = [1, m["kv_heads"], T, m["head_size"]]
        if b["shape"] != shape:
            out.append((f"/kv_cache/bindings/{k}/shape", f"KV binding {b['past']} is {b['shape']}; expected {shape} at tier {L}"))
        if b["bytes"] != nbytes(kv["dtype"], b["shape"]) or b["bytes"] > kv["region_bytes"]:
            out.append((f"/kv_cache/bindings/{k}/bytes", f"KV binding {b['past']} is {b['bytes']} bytes, which does not fit its shape or its {kv['region_bytes']}-byte region"))
        if b["past"] in tensors and tensors[b["past"]]["shape"] != b["shape"]:
            out.append((f"/tensors/{b['past']}/shape", f"{b['past']} is {tensors[b['past']]['shape']} but its KV binding is {b['shape']}"))
        spans.append((b["offset"], b["offset"] + kv["region_bytes"], b["past"]))
    spans.sort()
    for (_s1, e1, n1), (s2, _, n2) in zip(spans, spans[1:]):
        if e1 > s2:
            out.append(("/kv_cache/bindings", f"KV regions of {n1} and {n2} overlap"))
    if spans and spans[-1][1] > kv["total_bytes"]:
        out.append(("/kv_cache/total_bytes", f"the KV regions end at {spans[-1][1]}, past total_bytes {kv['total_bytes']}"))


# ----------------------------------------------------------------------------- cache descriptors


def encode_const(doc: dict) -> bytes:
    """cache/<node>.const: magic, version, flags, n, then n bytes of JSON (the node's descriptor:
    op type, attributes, and where each of its weights lies in model.bin)."""
    return _encode_doc(CONST_MAGIC, CONST_PREAMBLE, doc)


def decode_const(data: bytes, name: str = "const") -> dict:
    return _decode_doc(CONST_MAGIC, CONST_PREAMBLE, data, name, "descriptor")


# ----------------------------------------------------------------------------- the plan builder


def build_plan(*, phase: str, tier: int, seq: int, window: int, max_length: int, node: str, model: dict,
               steps: list[dict], info: dict, io: dict, weights: set[str],
               kv_dtype: str = "float32") -> dict:
    """The static-shape plan of one tier: every activation's dtype/shape/bytes, an arena with a
    first-fit offset for each activation and node scratch buffer (buffers live at the same step never
    share bytes), and the KV cache binding (past and present are one buffer)."""
    kv_names = {n for pair in io["past"] + io["present"] for n in pair}
    graph_inputs = [n for n in (io["input_ids"], io["attention_mask"]) if n]
    tensors: dict[str, dict] = {}
    for name, (dtype, shape) in info.items():
        if name in weights:
            continue
        tensors[name] = {"dtype": dtype, "shape": list(shape), "bytes": nbytes(dtype, shape)}
    first: dict[str, int] = {n: 0 for n in graph_inputs}
    last: dict[str, int] = {}
    n_steps = len(steps)
    schedule = []
    buffers = []
    for k, s in enumerate(steps, start=1):
        for o in s["outputs"]:
            first.setdefault(o, k)
        for i in s["inputs"]:
            last[i] = k
        schedule.append({"step": k, **s})
        if s["scratch"]:
            buffers.append({"name": f"{s['node']}/scratch", "size": s["scratch"], "first_step": k, "last_step": k})
    for out in [io["logits"]]:
        last[out] = n_steps + 1
    for name, t in tensors.items():
        if name in kv_names or name not in first:
            continue
        buffers.append({"name": name, "size": t["bytes"], "first_step": first[name], "last_step": max(last.get(name, first[name]), first[name])})
    arena_size = assign_offsets(buffers, PLAN_ALIGNMENT)
    buffers.sort(key=lambda b: (b["first_step"], b["offset"], b["name"]))
    kvh, hs = model["kv_heads"], model["head_size"]
    region = max_length * kvh * hs * DTYPE_SIZE[kv_dtype]
    kv_list = []
    for layer in range(model["layers"]):
        (pk, pv), (qk, qv) = io["past"][layer], io["present"][layer]
        for j, (past, present) in enumerate(((pk, qk), (pv, qv))):
            shape = [1, kvh, window, hs]
            kv_list.append({"layer": layer, "kind": "key" if j == 0 else "value", "past": past, "present": present,
                            "offset": (2 * layer + j) * region, "shape": shape, "bytes": nbytes(kv_dtype, shape)})
    return {
        "format": PLAN_FORMAT,
        "format_version": FORMAT_VERSION,
        "node": node,
        "phase": phase,
        "tier": tier,
        "sequence_length": seq,
        "kv_window": window,
        "max_length": max_length,
        "model": model,
        "io": {"input_ids": io["input_ids"], "attention_mask": io["attention_mask"], "logits": io["logits"]},
        "schedule": schedule,
        "tensors": tensors,
        "arena": {"alignment": PLAN_ALIGNMENT, "size": arena_size, "buffers": buffers},
        "kv_cache": {"binding": "past_present_shared", "dtype": kv_dtype, "max_length": max_length, "window": window,
                     "layout": "each layer's key and value have a region of max_length*kv_heads*head_size elements; a window W views the first kv_heads*W*head_size elements as [1, kv_heads, W, head_size]",
                     "region_bytes": region, "total_bytes": 2 * model["layers"] * region, "bindings": kv_list},
    }
