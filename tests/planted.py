"""A real shared library whose constructor writes a marker file when anything loads it: what a hostile
package or working folder would plant where a loader looks (tests of issue 37, items 4 and 5)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CONSTRUCTOR = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen("%s", "w");
    if (f) { fputs("ran\n", f); fclose(f); }
}
"""


def compile_library(out: Path, marker: Path) -> Path:
    """`out`, an ELF shared library whose constructor writes `marker` (gcc, or cc)."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise RuntimeError("a C compiler (gcc or cc) is needed to build the planted library")
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_name(out.name + ".c")
    src.write_text(CONSTRUCTOR % marker)
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(out), str(src)], check=True, capture_output=True)
    src.unlink()
    return out
