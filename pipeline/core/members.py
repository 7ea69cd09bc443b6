"""Many findings of one rule on one file, said once: their members named compactly.

`compact(["past_key_values.2.key", "past_key_values.2.value", ..., "past_key_values.29.value"])`
is `past_key_values.{2..29}.{key,value}`; names that do not form such a product are listed
(the first few, then how many in all). `grouped` folds findings into one that keeps every
member, for JSON and SARIF to list.
"""

from __future__ import annotations

import re
from dataclasses import replace

from raipack.core.findings import Finding

_TOKEN = re.compile(r"\d+|[A-Za-z_]+|[^A-Za-z_\d]")
SHOWN = 3  # names listed when they do not form a product


def compact(names: list[str]) -> str:
    """One pattern for a set of names that differ in a few places, else a short list."""
    names = list(dict.fromkeys(names))
    if len(names) == 1:
        return names[0]
    split = [_TOKEN.findall(n) for n in names]
    if len({len(t) for t in split}) == 1:
        columns = [list(dict.fromkeys(col)) for col in zip(*split)]
        size = 1
        for col in columns:
            size *= len(col)
        if size == len(names) and any(len(col) == 1 for col in columns):  # every combination, around a common part
            return "".join(_column(col) for col in columns)
    head = ", ".join(names[:SHOWN])
    return head if len(names) <= SHOWN else f"{head}, … ({len(names)} in all)"


def _column(values: list[str]) -> str:
    if len(values) == 1:
        return values[0]
    if all(v.isdigit() for v in values):
        nums = sorted(int(v) for v in values)
        if nums == list(range(nums[0], nums[-1] + 1)):
            return f"{{{nums[0]}..{nums[-1]}}}"
        return "{" + ",".join(str(n) for n in nums) + "}"
    return "{" + ",".join(values) + "}"


def grouped(findings: list[Finding], summary: str, members: list[str] | None = None, threshold: int = 2) -> list[Finding]:
    """`findings` (one rule, one file, one severity) as one finding when there are `threshold` or
    more: "<members compactly>: <n> <summary>", the first finding's pointer and hint, every member
    (by default each finding's pointer) kept in `members`."""
    if len(findings) < threshold:
        return list(findings)
    names = tuple(members if members is not None else [f.pointer for f in findings])
    return [replace(findings[0], message=f"{compact(list(names))}: {len(names)} {summary}", members=names)]
