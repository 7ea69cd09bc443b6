"""The files of a build's input model folder, checked as files before anything reads them.

Which entries a model folder may hold. Every entry must be a regular file or a folder,
read from inside the model folder: a symlink is followed only when its target is a
regular file inside the folder too. A symlink that leaves the folder (to /etc/passwd,
to a user's keys, to /dev/zero), a FIFO, a device or a socket is refused before it is
opened: the quantize stage copies every file it does not understand into the package,
so a link out of the folder would publish whatever it points at, and a device or FIFO
would hang or exhaust the build. This is the rule `raipack validate` applies to
packages (paths outside the package refused, RP101).

One named exception: a snapshot of the Hugging Face hub cache
(`models--<org>--<name>/snapshots/<revision>/`) holds links into the repository's own
`../../blobs/`, which huggingface_hub writes; a link from a snapshot to a regular file
directly in that `blobs` folder is accepted. The blobs are that repository's files,
named by their hash, so the link does not reach anything the model did not publish.
Any other target outside the folder is refused, and a blob that is itself a link
resolves elsewhere and is refused too.

Hidden entries of the folder itself (`.git`, `.cache`) are neither read by transformers nor
copied into the package, so they are skipped: a git clone's thousands of objects cost
nothing. Hidden entries in subfolders are checked: the quantize stage copies those.
"""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

from raipack.core.errors import UsageError
from raipack.core.package import LFS_MAX_SIZE, MAX_FILES, JsonError, parse_json, parse_lfs_pointer
from raipack.data import load_data

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
LFS_HINT = "run `git lfs pull` in the model's clone (or download the model again)"
# The hints of the input checks' errors (pipeline/builder/inputs.py and hf_checks.py)
FIX_CONFIG = "fix config.json, or use the config.json the model was published with"
FIX_TOKENIZER = "use the tokenizer files published with this model"
FIX_GENERATION = "fix generation_config.json, or use the one the model was published with"
FIX_TEMPLATE = "use the chat template published with this model"


def check_entries(root: Path) -> None:
    """Refuse (UsageError) any entry of the model folder that is not a regular file or a
    folder inside it (see the module docstring), and any Git LFS pointer file."""
    real_root = os.path.realpath(root)
    blobs = _hub_blobs(real_root)
    count = 0
    root = Path(root)
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            raise UsageError(f"{folder} cannot be listed: {exc.strerror or exc}", "check its permissions") from None
        for entry in entries:
            if entry.name.startswith(".") and folder == root:  # the quantize stage skips these too; below, it copies them
                continue
            count += 1
            if count > MAX_FILES:
                raise UsageError(f"{root} holds more than {MAX_FILES} files; expected a Hugging Face model folder", "pass the model's own folder, not a parent of it")
            path = Path(entry.path)
            st = _entry_stat(path, entry, real_root, blobs)
            if stat.S_ISDIR(st.st_mode):
                stack.append(path)
            elif st.st_size <= LFS_MAX_SIZE:
                if parse_lfs_pointer(read_head(path, LFS_MAX_SIZE) or b"") is not None:
                    raise UsageError(f"{path} is a Git LFS pointer, not the {'weights' if path.suffix == '.safetensors' else 'file'}; run `git lfs pull`", LFS_HINT)


def _hub_blobs(real_root: str) -> str | None:
    """`<repo>/blobs` when the folder is a snapshot of the Hugging Face hub cache."""
    parent = os.path.dirname(real_root)
    repo = os.path.dirname(parent)
    if os.path.basename(parent) == "snapshots" and os.path.basename(repo).startswith("models--"):
        return os.path.join(repo, "blobs")
    return None


def _entry_stat(path: Path, entry: os.DirEntry, real_root: str, blobs: str | None) -> os.stat_result:
    """The stat of what the entry is, after the symlink rule; UsageError when refused."""
    if entry.is_symlink():
        target = os.path.realpath(path)
        try:
            st = os.stat(target)
        except OSError:
            raise UsageError(f"{path} is a broken symlink or a symlink loop", "replace it with the real file") from None
        inside = os.path.commonpath([real_root, target]) == real_root
        in_hub_blobs = blobs is not None and os.path.dirname(target) == blobs
        if not (inside or in_hub_blobs):
            raise UsageError(f"{path} is a symlink that leaves the model folder (to {target}); raipack reads only files inside the folder",
                             "copy the file into the model folder instead of linking to it")
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{path} is a symlink to {_kind(st)}; expected a regular file", "replace the link with the file itself")
        return st
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError as exc:
        raise UsageError(f"{path} cannot be read: {exc.strerror or exc}", "check its permissions") from None
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise UsageError(f"{path} is {_kind(st)}, not a regular file", "remove it from the model folder")
    return st


def _kind(st: os.stat_result) -> str:
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


def read_head(path: Path, n: int) -> bytes | None:
    """The first `n` bytes of a regular file, opened without blocking; None when it is not one."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise UsageError(f"{path} cannot be read: {exc.strerror or exc}", "check its permissions") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return fh.read(n)


# ----------------------------------------------------------------------------------- safetensors

def check_safetensors(path: Path) -> None:
    """Read a safetensors file's header the way the safetensors library will, and refuse
    (UsageError, one sentence) what it would refuse with a traceback: an LFS pointer, a header
    length beyond the cap or the file, a header that is not a JSON object, a tensor whose dtype,
    shape or data offsets do not describe the bytes that follow. Reads the header only."""
    rules = load_data("safetensors.json")
    fix = "download the weights again (the file is damaged or incomplete)"
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise UsageError(f"{path} cannot be read: {exc.strerror or exc}", "check its permissions") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{path} is {_kind(st)}, not a safetensors file", "replace it with the weights file")
        head = fh.read(max(8, LFS_MAX_SIZE) if st.st_size <= LFS_MAX_SIZE else 8)
        if parse_lfs_pointer(head) is not None:
            raise UsageError(f"{path} is a Git LFS pointer, not the weights; run `git lfs pull`", LFS_HINT)
        if len(head) < 8:
            raise UsageError(f"{path} is {st.st_size} bytes, too short for a safetensors file (8-byte header length, then the header)", fix)
        (length,) = struct.unpack("<Q", head[:8])
        if length > rules["max_header_bytes"] or 8 + length > st.st_size:
            raise UsageError(f"{path}: the header length is {length} bytes, but the file has {st.st_size} bytes and a header may have at most {rules['max_header_bytes']}", fix)
        fh.seek(8)
        raw = fh.read(length)
    data_size = st.st_size - 8 - length
    try:
        text = raw.decode("utf-8").rstrip(" ")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: the header is not UTF-8 text (byte {8 + exc.start})", fix) from None
    try:
        header, duplicates = parse_json(text)
    except JsonError as exc:
        raise UsageError(f"{path}: the header {exc}", fix) from None
    if not isinstance(header, dict) or not text.startswith("{"):
        raise UsageError(f"{path}: the header is not a JSON object", fix)
    if duplicates:
        raise UsageError(f"{path}: the header names tensor {duplicates[0].key!r} twice", fix)
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise UsageError(f"{path}: the header's __metadata__ is not an object of strings", fix)
    _check_tensors(path, header, data_size, rules["dtype_bits"], fix)


def _check_tensors(path: Path, header: dict, data_size: int, dtype_bits: dict, fix: str) -> None:
    spans = []
    for tensor, info in header.items():
        where = f"{path}: tensor {short(tensor)}"
        if not isinstance(info, dict):
            raise UsageError(f"{where} is described by {short(info)}; expected an object with dtype, shape and data_offsets", fix)
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in dtype_bits:
            raise UsageError(f"{where} has dtype {short(dtype)}; expected one of {', '.join(dtype_bits)}", fix)
        if not (isinstance(shape, list) and all(_is_size(d) for d in shape)):
            raise UsageError(f"{where} has shape {short(shape)}; expected a list of non-negative integers", fix)
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_size(o) for o in offsets) and offsets[0] <= offsets[1] <= data_size):
            raise UsageError(f"{where} has data_offsets {short(offsets)}; expected [begin, end] within the {data_size} bytes of tensor data", fix)
        bits = dtype_bits[dtype]
        for d in shape:
            bits *= d
        if bits != 8 * (offsets[1] - offsets[0]):
            raise UsageError(f"{where}: {dtype} {shape} needs {bits / 8:g} bytes, but data_offsets {offsets} hold {offsets[1] - offsets[0]}", fix)
        spans.append((offsets[0], offsets[1], tensor))
    end = 0
    for begin, stop, tensor in sorted(spans):
        if begin != end:
            raise UsageError(f"{path}: tensor {short(tensor)} starts at byte {begin} of the tensor data, where {end} was expected (tensors overlap or leave a gap)", fix)
        end = stop
    if end != data_size:
        raise UsageError(f"{path}: the tensors hold {end} bytes, but {data_size} bytes of tensor data follow the header", fix)


def _is_size(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def short(value, limit: int = 60) -> str:
    """repr() of a value read from the input, cut to `limit` characters for a one-line message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
