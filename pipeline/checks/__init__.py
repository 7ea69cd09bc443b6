"""The check registry: every check has a stable id, a severity and a doc.

A check is a function `fn(ctx) -> Iterable[Finding]` registered with
`@check(...)`; its docstring is the paragraph `raipack checks` prints.
Reporters only format the findings.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Iterable

from pipeline.core.findings import Finding
from pipeline.core.package import Package
from pipeline.npu.genai import ryzenai_options

MODULES = ("files", "jsonfiles", "quant", "provider", "consistency", "buckets", "graph", "manifest", "npu_format", "advice")


@dataclass(frozen=True)
class CheckSpec:
    id: str
    name: str
    severity: str
    doc: str
    fn: Callable
    needs: str = ""  # an option that must be on for the check to run ("verify_hashes")


REGISTRY: dict[str, CheckSpec] = {}


def check(check_id: str, name: str, severity: str = "error", needs: str = ""):
    def register(fn):
        if check_id in REGISTRY:
            raise RuntimeError(f"check id {check_id} registered twice")
        doc = inspect.cleandoc(fn.__doc__ or "")
        REGISTRY[check_id] = CheckSpec(check_id, name, severity, doc, fn, needs)
        return fn

    return register


def load_all() -> dict[str, CheckSpec]:
    for mod in MODULES:
        importlib.import_module(f"{__name__}.{mod}")
    return dict(sorted(REGISTRY.items()))


class Context:
    """What a check sees: the package, its profile and the run's options."""

    def __init__(self, pkg: Package, profile: dict, verify_hashes: bool = False, jobs: int | None = None):
        self.pkg = pkg
        self.profile = profile
        self.verify_hashes = verify_hashes
        self.jobs = jobs
        self.current: CheckSpec | None = None

    def finding(self, path: str, message: str, hint: str = "", pointer: str = "", severity: str | None = None) -> Finding:
        spec = self.current
        return Finding(spec.id, severity or spec.severity, path, message, hint, pointer)

    # Parsed inputs shared by several checks; broken files read as None (RP201 reports them).
    @cached_property
    def genai(self):
        return self.pkg.try_json("genai_config.json")

    @cached_property
    def model_config(self):
        return self.pkg.try_json("config.json")

    @cached_property
    def rai_config(self):
        return self.pkg.try_json("rai_config.json")

    @cached_property
    def options(self) -> tuple[dict, dict]:
        return ryzenai_options(self.genai)

    @cached_property
    def quant_config(self):
        cfg = self.model_config
        q = cfg.get("quantization_config") if isinstance(cfg, dict) else None
        return q if isinstance(q, dict) else None

    @cached_property
    def graph_rel(self) -> str | None:
        """The decoder graph the genai config names, else the only .onnx file."""
        dec = (self.genai or {}).get("model", {}).get("decoder", {}) if isinstance(self.genai, dict) else {}
        name = dec.get("filename") if isinstance(dec, dict) else None
        if isinstance(name, str) and name in self.pkg.files:
            return name
        graphs = [f.rel for f in self.pkg.by_role("graph")]
        return graphs[0] if len(graphs) == 1 else None

    @cached_property
    def graph(self):
        """The decoder graph without its weights, or None (RP701 says why)."""
        from pipeline.checks.graph import load_graph

        return load_graph(self)


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
