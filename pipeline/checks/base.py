"""What every check module needs, and nothing else: the `@check` decorator, its CheckSpec and the
Context a check reads. It imports no check module, so check modules stay leaves (the import-linter
contract "Check modules are leaves"); the registry (pipeline/checks/__init__.py) loads them."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from raipack.core.findings import Finding
from raipack.core.package import Package
from raipack.npu.genai import ryzenai_options, table
from raipack.npu.graph import load_graph
from raipack.npu.settings import NpuSettings
from raipack.npu.spec import Profile


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


class Context:
    """What a check sees: the package, its profile and the run's options."""

    def __init__(self, pkg: Package, profile: Profile, verify_hashes: bool = False, jobs: int | None = None):
        self.pkg = pkg
        self.profile = profile
        self.verify_hashes = verify_hashes
        self.jobs = jobs
        self.platform: str | None = None  # where the package is to run ("linux": RP407 holds it to AMD's Linux steps)
        self.current: CheckSpec | None = None

    def finding(self, path: str, message: str, hint: str = "", pointer: str = "", severity: str | None = None, members: tuple[str, ...] = ()) -> Finding:
        spec = self.current
        return Finding(spec.id, severity or spec.severity, path, message, hint, pointer, tuple(members))

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
    def settings(self):
        """The package's NPU settings (lengths, tiers, chunking, KV buffer) as its files give them."""

        return NpuSettings.from_package(self.pkg, self.profile, genai=self.genai, rai_config=self.rai_config)

    @cached_property
    def quant_config(self):
        cfg = self.model_config
        q = cfg.get("quantization_config") if isinstance(cfg, dict) else None
        return q if isinstance(q, dict) else None

    @cached_property
    def graph_rel(self) -> str | None:
        """The decoder graph the genai config names, else the only .onnx file."""
        name = table(table(self.genai, "model"), "decoder").get("filename")
        if isinstance(name, str) and name in self.pkg.files:
            return name
        graphs = [f.rel for f in self.pkg.by_role("graph")]
        return graphs[0] if len(graphs) == 1 else None

    @cached_property
    def graph(self):
        """The decoder graph without its weights, or None (RP701 says why)."""
        return load_graph(self.pkg, self.graph_rel)
