"""Memory: what the machine has free for a stage, sizes in words, and a process's measured peak.

``available()`` is what the build runner compares every stage's estimate with (the stage registry,
pipeline/builder/stages.py) before the stage loads anything. ``RAIPACK_MEMORY_LIMIT`` (bytes, or with
a unit: ``8GiB``, ``512MiB``, ``16G``, ``2.5GB``) replaces the measured free memory: a fake small
machine for tests, and a budget to keep a build inside.
"""

from __future__ import annotations

import os
import re
import resource

from raipack.core.errors import UsageError

ENV_LIMIT = "RAIPACK_MEMORY_LIMIT"
GIB = 1 << 30
MIB = 1 << 20
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 10**3, "m": MIB, "mib": MIB, "mb": 10**6,
          "g": GIB, "gib": GIB, "gb": 10**9, "t": 1 << 40, "tib": 1 << 40, "tb": 10**12}


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n < 10 * GIB else f"{n / GIB:.1f} GiB"


def parse_size(text: str) -> int:
    """``"8GiB"`` -> 8589934592; bytes when there is no unit (K/M/G/T and KiB... are powers of 1024, KB... of 1000)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m and _UNITS.get(m.group(2).lower())
    if not m or unit is None:
        raise UsageError(f"{ENV_LIMIT}={text!r} is not a size", f"give bytes or a number with a unit, e.g. {ENV_LIMIT}=8GiB")
    return int(float(m.group(1)) * unit)


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return None


def available(device: str = "cpu") -> tuple[int | None, str]:
    """Bytes free for a stage on ``device`` and where the number comes from.

    ``$RAIPACK_MEMORY_LIMIT`` wins; else MemAvailable (/proc/meminfo, psutil as fallback)
    for cpu and ``torch.cuda.mem_get_info`` for cuda. ``None`` when it cannot be known.
    """
    limit = os.environ.get(ENV_LIMIT, "").strip()
    if limit:
        return parse_size(limit), ENV_LIMIT
    if device == "cuda":
        try:
            import torch

            if torch.cuda.is_available():
                return int(torch.cuda.mem_get_info()[0]), "free GPU memory"
        except Exception:  # no usable CUDA build: the stage reports the device itself
            pass
        return None, "no CUDA device"
    return _meminfo_available(), "MemAvailable"


def reset_peak_rss() -> bool:
    """Reset this process's VmHWM (Linux >= 4.0: "5" into clear_refs); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """This process's peak resident set (VmHWM) since the last reset, else its lifetime maximum."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
