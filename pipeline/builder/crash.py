"""The last resort for an exception a stage did not turn into a sentence.

A stage refuses what it understands with a RaipackError. Anything else escaping a stage's
run (a library's TypeError on an input the checks did not foresee, or a raipack bug) still
ends as one sentence and exit code 1: "stage quantize failed on <model>: <type>: <first line>",
with the full traceback written to `<output>/<package>.stages/<stage>.traceback.txt`, a file
outside the cache that the failed build's cleanup does not remove. KeyboardInterrupt and
SystemExit are not Exceptions and pass through untouched; MemoryError becomes a sentence
about memory.
"""

from __future__ import annotations

import traceback
from pathlib import Path

from raipack.builder.naming import package_name
from raipack.core.errors import RaipackError
from raipack.npu.spec import Profile


class StageCrashed(RaipackError):
    """A stage ended with an exception that is not a RaipackError."""


def stage_crashed(stage: str, recipe, profile: Profile, exc: Exception) -> StageCrashed:
    """The error to raise instead of `exc`, after writing its traceback to a file."""
    model = recipe.model_name()
    if isinstance(exc, MemoryError):
        return StageCrashed(f"stage {stage} ran out of memory on {model}",
                            "close other programs or build on a machine with more memory; for quantize, a smaller calibration (--num-samples, --seq-len) needs less")
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    first = lines[0][:300] if lines else ""
    saved = Path(recipe.output) / f"{package_name(recipe, profile)}.stages" / f"{stage}.traceback.txt"
    try:
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text("".join(traceback.format_exception(exc)), encoding="utf-8", errors="backslashreplace")
        where = f"the full traceback is in {saved}"
    except OSError as err:
        where = f"its traceback could not be written to {saved} ({err.strerror or err})"
    return StageCrashed(f"stage {stage} failed on {model}: {type(exc).__name__}" + (f": {first}" if first else ""),
                        f"{where}; if the model folder is a valid one, this is a raipack bug: please report it with that file")
