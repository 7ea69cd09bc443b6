"""Give a loaded model's weights memory of their own before Quark writes into them.

transformers maps the safetensors file and hands out tensors that are views of the mapping (no copy, pages
read as they are touched). Quark's AWQ and GPTQ then write every quantized linear in place (scaling,
clipping, ``weight.data = fake-quantized``): each written page of a private file mapping becomes an
anonymous copy that lives as long as the whole mapping, that is until the last tensor of the file is gone.
Measured on random Llama-3.2-1B-width layers in bfloat16 (issue 25): anonymous memory grew by twice each
decoder layer's size per layer, so a Llama-3.1-8B would have needed about 2 copies of its linears on top
of the model.

``own_mapped_tensors`` moves every parameter and buffer that lies inside a mapped file into an anonymous
tensor of the same dtype and shape, reading the bytes with ``pread`` (through the page cache, never
through the mapping, so the file's pages are not resident in the process beside the copy). Tied weights
stay tied (one tensor, one copy). Linux only (``/proc/self/maps``); elsewhere nothing moves.

The quantize stage keeps the token embedding (and an lm_head it does not quantize) as views: Quark never
writes them and AWQ/GPTQ never read them after the first layer's inputs are cached, so their pages are not
resident during the calibration (2 GiB of bfloat16 at Llama-3.1-8B's 128K vocabulary) and are read once
by the export.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_READ_CHUNK = 1 << 30  # preadv reads at most about 2 GiB at once on Linux


@dataclass(frozen=True)
class _Mapping:
    start: int
    end: int
    offset: int
    path: str


def file_mappings(suffix: str = ".safetensors", maps: Path = Path("/proc/self/maps")) -> list[_Mapping]:
    """This process's mappings of files whose name ends with ``suffix``, sorted by address."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or not parts[5].endswith(suffix):
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        out.append(_Mapping(start, end, int(parts[2], 16), parts[5]))
    return sorted(out, key=lambda m: m.start)


def _inside(mappings: list[_Mapping], starts: list[int], ptr: int, nbytes: int) -> _Mapping | None:
    i = bisect.bisect_right(starts, ptr) - 1
    if i < 0:
        return None
    m = mappings[i]
    return m if ptr + nbytes <= m.end else None


def _read_into(fd: int, buffer: Any, offset: int) -> None:
    view = memoryview(buffer).cast("B")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:done + _READ_CHUNK]], offset + done)
        if n <= 0:
            raise OSError(f"short read at byte {offset + done}")
        done += n


def own_mapped_tensors(model: Any, suffix: str = ".safetensors", keep: Iterable[Any] = ()) -> dict[str, int]:
    """Move the parameters and buffers of ``model`` that are views of a mapped ``*suffix`` file into memory
    of their own (same values, dtype, shape), all but the tensors in ``keep`` (those nothing writes into: they
    stay views, resident only where they are read); returns ``{"tensors": moved, "bytes": moved bytes,
    "kept_mapped_bytes": the bytes of ``keep`` that are such views}``."""
    import torch

    kept = {id(t) for t in keep if t is not None}
    mappings = file_mappings(suffix)
    if not mappings:
        return {"tensors": 0, "bytes": 0, "kept_mapped_bytes": 0}
    starts = [m.start for m in mappings]
    seen: set[int] = set()
    fds: dict[str, int] = {}
    moved = total = kept_bytes = 0
    try:
        for tensor in [*model.parameters(), *model.buffers()]:
            if id(tensor) in seen or tensor.device.type != "cpu" or not tensor.is_contiguous() or tensor.numel() == 0:
                continue
            seen.add(id(tensor))
            nbytes = tensor.numel() * tensor.element_size()
            m = _inside(mappings, starts, tensor.data_ptr(), nbytes)
            if m is None:
                continue
            if id(tensor) in kept:
                kept_bytes += nbytes
                continue
            if m.path not in fds:
                fds[m.path] = os.open(m.path, os.O_RDONLY)
            own = torch.empty_like(tensor, memory_format=torch.contiguous_format)
            _read_into(fds[m.path], own.view(-1).view(torch.uint8).numpy(), tensor.data_ptr() - m.start + m.offset)
            tensor.data = own
            moved += 1
            total += nbytes
    finally:
        for fd in fds.values():
            os.close(fd)
    return {"tensors": moved, "bytes": total, "kept_mapped_bytes": kept_bytes}


_MADV_DONTNEED = 4  # Linux's value (asm-generic/mman-common.h)


def release_resident_pages(tensors: Iterable[Any], suffix: str = ".safetensors") -> int:
    """Give back the resident pages of ``tensors`` that are views of a mapped ``*suffix`` file and that nothing
    wrote into (the kept embedding and lm_head): ``madvise(MADV_DONTNEED)`` over the whole pages inside each.
    The pages stay in the page cache and fault back in when read again, with the same bytes (a private mapping
    nothing wrote into has no copies of its own to lose). Returns the bytes of the ranges released; 0 off Linux.

    The quantize stage calls it after the source's probe: the probe's forward reads the whole lm_head (1 GiB at
    Llama-3.1-8B), whose pages otherwise stayed resident through Quark's export, on top of its peak."""
    import ctypes
    import mmap

    mappings = file_mappings(suffix)
    if not mappings:
        return 0
    starts = [m.start for m in mappings]
    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    released = 0
    seen: set[int] = set()
    for tensor in tensors:
        if tensor is None or id(tensor) in seen or tensor.device.type != "cpu":
            continue
        seen.add(id(tensor))
        ptr, nbytes = tensor.data_ptr(), tensor.numel() * tensor.element_size()
        if _inside(mappings, starts, ptr, nbytes) is None:
            continue
        first, end = -(-ptr // page) * page, (ptr + nbytes) // page * page  # whole pages inside the tensor only
        if end > first and libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(end - first), _MADV_DONTNEED) == 0:
            released += end - first
    return released
