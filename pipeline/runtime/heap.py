"""glibc's heap: give freed memory back to the system between the big steps of a stage (Linux only)."""

from __future__ import annotations

import sys
from typing import Any


def libc() -> Any:
    """glibc through ctypes when it has mallopt and malloc_trim (Linux), else None."""
    import ctypes
    import ctypes.util

    if not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return lib if hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim") else None
    except OSError:
        return None


def trim_heap() -> bool:
    """Return the free pages of glibc's heap to the system (``malloc_trim(0)``: also the free chunks in the
    middle of the heap, not only its top) without changing the allocator's tuning. The quantize stage calls it
    after each decoder layer of AWQ/GPTQ and each linear Quark's export converts; the export stage between the
    model builder and parity, and between parity's two models. True when glibc was there to ask."""
    lib = libc()
    if lib is None:
        return False
    lib.malloc_trim(0)
    return True
