"""One run of the reference fuse backend (stages/fuse/reference.py): its inputs, the NPU settings it
writes, the fused graph and what it wrote; shared by the modules that write the package's parts."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from raipack.npu.settings import NpuSettings
from raipack.npu.spec import Profile

NODE = "decoder"  # the <node> of the dd_metastate file names: one plan covers the whole decoder


def write_json(path: Path, doc) -> int:
    data = (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")  # no \\uXXXX: onnxruntime-genai refuses them
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return len(data)


@dataclass
class FuseRun:
    """One fuse run: its inputs, the NPU settings it writes, the fused graph and what it wrote."""

    export_dir: Path
    quark_dir: Path | None
    profile: Profile
    genai: dict
    model: object  # the export's ModelProto, without its weights
    settings: NpuSettings
    fg: object = None  # raipack.stages.fuse.graph.FuseGraphResult
    model_config: dict = field(default_factory=dict)
    findings: list = field(default_factory=list)
    report: Callable = lambda what, done, total: None
    written: dict = field(default_factory=dict)
    dims: dict = field(default_factory=dict)
    header_sha: str = ""
    graph_sha: str = ""
    names: dict = field(default_factory=dict)  # graph, data, header, weights: the profile's file names
    dropped_keys: list = field(default_factory=list)  # JSON pointers of genai_config keys the release's loader does not know

    @property
    def L(self) -> dict:
        return self.settings.report()
