"""The check registry: every check has a stable id, a severity and a doc.

A check is a function `fn(ctx) -> Iterable[Finding]` registered with
`@check(...)` (pipeline/checks/base.py); its docstring is the paragraph
`raipack checks` prints. Only this module loads the check modules; they import
base.py and the npu layer, never each other. Reporters only format the findings.
"""

from __future__ import annotations

import importlib
from typing import Iterable

from raipack.checks.base import REGISTRY, CheckSpec, Context, check
from raipack.core.findings import Finding

__all__ = ["REGISTRY", "CheckSpec", "Context", "check", "load_all", "run_checks"]

MODULES = ("files", "jsonfiles", "quant", "provider", "consistency", "buckets", "graph", "manifest", "npu_format", "npu_fused", "npu_plans", "advice", "runtime", "loader", "opened")


def load_all() -> dict[str, CheckSpec]:
    for mod in MODULES:
        importlib.import_module(f"{__name__}.{mod}")
    return dict(sorted(REGISTRY.items()))


def run_checks(ctx: Context, select: Iterable[str] = (), ignore: Iterable[str] = ()) -> tuple[list[Finding], list[str]]:
    select, ignore = tuple(select), tuple(ignore)
    findings: list[Finding] = []
    ran: list[str] = []
    for spec in load_all().values():
        if (select and not _matches(spec, select)) or _matches(spec, ignore):
            continue
        if spec.needs and not getattr(ctx, spec.needs):
            continue
        ctx.current = spec
        findings.extend(spec.fn(ctx) or ())
        ran.append(spec.id)
    ctx.current = None
    return findings, ran


def _matches(spec: CheckSpec, ids: tuple[str, ...]) -> bool:
    """`RP1` selects every RP1xx check; a check's name works too."""
    return any(spec.id.startswith(i) or spec.name == i for i in ids)
