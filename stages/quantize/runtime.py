"""How the quantize stage runs on the CPU: threads and allocator settings (applied before torch
and quark are imported) and peak memory measurement."""

from __future__ import annotations

import os
import sys
from typing import Any

from raipack.runtime import heap


def _cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
MMAP_THRESHOLD = 1 << 30  # 1 GiB: AWQ's largest temporaries stay below it
TRIM_THRESHOLD = (1 << 31) - 1  # mallopt takes an int
TOP_PAD = 1 << 28


def runtime_env(threads: int | None = None) -> dict[str, str]:
    """Environment for a process that runs Quark on CPU (measured: docs/measurements/quantize.md).

    Pass it to a subprocess that runs the stage: the OpenMP and glibc variables are read
    once at start-up. ``apply_runtime_settings`` gets the same effect inside an already
    running process (mallopt through ctypes, torch thread count).
    """
    n = str(threads or _cpu_count())
    return {
        "OMP_NUM_THREADS": n,
        "MKL_NUM_THREADS": n,
        # Idle OpenMP workers sleep instead of spinning: on a shared 2-core machine spinning
        # workers burn the core another process (or our own other thread) needs.
        "OMP_WAIT_POLICY": "PASSIVE",
        # glibc malloc: serve large blocks from the heap and keep freed memory instead of
        # mmap/munmap per allocation. AWQ's clipping search allocates and frees tensors of
        # hundreds of MB in a tight loop; otherwise every one is a fresh mapping whose pages
        # the kernel zeroes again (the high system time the issue measured).
        "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
        "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
        "MALLOC_TOP_PAD_": str(TOP_PAD),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


_libc = heap.libc


def apply_runtime_settings(threads: int | None = None) -> dict[str, Any]:
    """Apply the runtime settings inside this process; returns what was applied.

    Missing ``runtime_env`` variables go into ``os.environ`` (OpenMP honours them only if
    torch is imported afterwards; child processes always do); glibc's allocator is tuned
    with ``mallopt``; torch gets the thread count and flush-denormal mode.
    """
    env = runtime_env(threads)
    torch_loaded = "torch" in sys.modules
    for key, value in env.items():
        os.environ.setdefault(key, value)
    libc = _libc()
    mallopt = False
    if libc is not None:
        mallopt = all(
            libc.mallopt(param, value) == 1
            for param, value in (
                (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                (_M_TOP_PAD, TOP_PAD),
            )
        )
    import torch

    n = int(threads or int(os.environ.get("OMP_NUM_THREADS") or env["OMP_NUM_THREADS"]))
    torch.set_num_threads(n)
    denormal = bool(torch.set_flush_denormal(True))
    compiles, why = quark_compile()
    return {
        "torch_threads": torch.get_num_threads(),
        "flush_denormal": denormal,
        "mallopt": mallopt,
        "omp_env_effective": not torch_loaded,
        "quark_compile": compiles,
        "quark_compile_why": why,
        "env": env,
    }


def quark_compile() -> tuple[bool, str]:
    """Whether Quark will torch.compile its fake-quantize kernel (``ScaledFakeQuantize``), and why.

    Compiled, AWQ's scale search at Llama-3.1-8B width takes 2.80 GiB and 22 s a layer instead of
    4.67 GiB and 33 s (docs/measurements/quantize.md, issue 41), so the stage leaves Quark's default
    (compile on Linux, not on Windows, where inductor needs Triton) unless the user set
    ``QUARK_DISABLE_COMPILE`` or torch's inductor finds no C++ compiler (``CXX`` or ``g++``): then
    ``QUARK_DISABLE_COMPILE=1`` goes into the environment, before Quark reads it at its import.
    """
    constants = sys.modules.get("quark.torch.utils.constants")
    if constants is not None:  # read at Quark's import: too late to change
        return not constants.QUARK_DISABLE_COMPILE, "fixed when Quark was imported, before the stage"
    value = os.environ.get("QUARK_DISABLE_COMPILE")
    if value is not None:
        return value != "1", f"QUARK_DISABLE_COMPILE={value} in the environment"
    if sys.platform == "win32":
        return False, "Quark's default on Windows (torch's inductor needs Triton there)"
    try:
        # late: torch's own search for the compiler inductor will call (imported by a compile anyway)
        from torch._inductor import cpp_builder

        cpp_builder.get_cpp_compiler()
    except (ImportError, RuntimeError) as exc:  # InvalidCxxCompiler is a RuntimeError
        os.environ["QUARK_DISABLE_COMPILE"] = "1"
        return False, f"no C++ compiler for torch's inductor ({str(exc).strip()})"
    return True, f"Quark's default on {sys.platform}"


# After a run the process goes on (fuse and smoke in `raipack build`, more builds in a test worker):
# glibc's own behaviour comes back, so big temporaries are mapped and unmapped again and freed heap
# is returned. Kept tuned, a worker that ran several builds held 10-12 GiB it no longer used, and
# two of them beside the end-to-end build ran a 24 GiB machine out of memory.
AFTER_MMAP_THRESHOLD = 32 << 20  # the top of glibc's dynamic threshold on 64-bit
AFTER_TRIM_THRESHOLD = 64 << 20
AFTER_TOP_PAD = 128 << 10  # glibc's default


# after each decoder layer of AWQ/GPTQ: with trimming off, the freed temporaries of one layer did not all fit
# the next layer's, and the heap grew layer after layer (docs/measurements/real_size.md, issue 25)
trim_heap = heap.trim_heap


def release_memory() -> bool:
    """Give the memory the tuned allocator kept back to the system and stop keeping it (after a
    run, also a failed one); True when glibc's settings were restored."""
    import gc

    gc.collect()
    libc = _libc()
    if libc is None:
        return False
    restored = all(libc.mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_THRESHOLD, AFTER_MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, AFTER_TRIM_THRESHOLD), (_M_TOP_PAD, AFTER_TOP_PAD)))
    libc.malloc_trim(0)
    return restored


def restore_denormals() -> None:
    """Turn torch's flush-denormal mode (which apply_runtime_settings set for AWQ's speed) off again after
    the run: the mode is the CPU's, process-wide, and the stages and runs after quantize in the same
    process (the reference runtime's BFP16 emulation above all, whose block scales can be subnormal)
    must compute with IEEE subnormals, as a fresh process does."""
    import torch

    torch.set_flush_denormal(False)
