"""raipack's open binary formats for the reference package: `model.pb.bin` + `model.bin`, the
`dd_metastate_*` `.state` files, and the `cache/<node>.const` descriptors (the `.plan` files and
their shared schedules are pipeline/npu/plans.py).

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
import os
import struct
from concurrent.futures import Future, ThreadPoolExecutor
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


MAX_HEADER_FILE = MAX_HEADER_JSON + 64


def check_header_size(size: int, name: str) -> None:
    """Refuses (FormatError) a header file too large to read whole."""
    if size > MAX_HEADER_FILE:
        raise FormatError(f"{name} is {size} bytes, too large for a header", "check that the header and weights files were not swapped")


def read_header(path: Path) -> dict:
    path = Path(path)
    check_header_size(path.stat().st_size, path.name)
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


def put_bytes(fd: int, data, at: int, source: tuple[int, int] | None = None) -> None:
    """Writes `data` at byte `at` of the file `fd`. With `source`, (fd, offset) of the same bytes in
    another file, the kernel copies them (os.copy_file_range: no page faults, no user-space copy, a
    reflink where the file system can); where it cannot, the bytes go through `data`."""
    mv, done = memoryview(data).cast("B"), 0
    copy = getattr(os, "copy_file_range", None)
    if source is not None and copy is not None:
        try:
            while done < mv.nbytes:
                n = copy(source[0], fd, mv.nbytes - done, source[1] + done, at + done)
                if n <= 0:
                    break
                done += n
        except OSError:  # another file system, an old kernel: the plain path below
            done = 0
    while done < mv.nbytes:
        done += os.pwrite(fd, mv[done:], at + done)


def _sha256(data: memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


class WeightsWriter:
    """Writes model.bin: places tensors at `alignment`-byte boundaries (the gaps are holes, read as
    zero bytes) and hashes them on a thread pool while the next one is written (hashlib and file
    writes both release the GIL)."""

    def __init__(self, path: Path, alignment: int = ALIGNMENT, workers: int = 2):
        self.path = Path(path)
        self.alignment = alignment
        self.fh = open(self.path, "wb", buffering=0)
        self.pos = 0
        self.entries: dict[str, dict] = {}
        self._futures: list[tuple[dict, Future[str]]] = []
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers))

    def add(self, name: str, data, dtype: str, shape, source: tuple[int, int] | None = None) -> dict:
        """`data` is a bytes-like object (a memoryview over the source file is never copied);
        `source` is (fd, offset) of the same bytes in a file, for put_bytes."""
        if name in self.entries:
            return self.entries[name]
        mv = memoryview(data).cast("B")
        start = align(self.pos, self.alignment)
        put_bytes(self.fh.fileno(), mv, start, source)
        self.pos = start + mv.nbytes
        entry = {"name": name, "offset": start, "size": mv.nbytes, "dtype": dtype, "shape": [int(d) for d in shape], "sha256": ""}
        self.entries[name] = entry
        self._futures.append((entry, self._pool.submit(_sha256, mv)))
        return entry

    def close(self) -> int:
        self.pos = align(self.pos, self.alignment) if self.pos else 0
        os.ftruncate(self.fh.fileno(), self.pos)
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


# ----------------------------------------------------------------------------- cache descriptors


def encode_const(doc: dict) -> bytes:
    """cache/<node>.const: magic, version, flags, n, then n bytes of JSON (the node's descriptor:
    op type, attributes, and where each of its weights lies in model.bin)."""
    return _encode_doc(CONST_MAGIC, CONST_PREAMBLE, doc)


def decode_const(data: bytes, name: str = "const") -> dict:
    return _decode_doc(CONST_MAGIC, CONST_PREAMBLE, data, name, "descriptor")
