"""Fast stand-in stages for runner tests: real stage objects whose run() writes
generated packages (tests/factory.py) slowly enough to be killed mid-write."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from factory import make_package
from pipeline import stage as stage_mod
from pipeline.stage import Stage

CALLS = Path(os.environ.get("RAIPACK_FAKE_CALLS", "/dev/null"))


@dataclass(frozen=True)
class FakeConfig:
    delay: float = 0.0
    fail: bool = False


def _writer(profile_id: str):
    def run(job):
        with open(CALLS, "a") as fh:
            fh.write(job.stage.name + "\n")
        tmp = Path(tempfile.mkdtemp(prefix=f"raipack-fake-{job.stage.name}-"))
        pkg = make_package(tmp, profile_id, name="x")
        (pkg / "manifest.json").unlink(missing_ok=True)
        for item in sorted(pkg.iterdir()):
            time.sleep(job.config.delay)
            shutil.move(str(item), job.workdir / item.name)
        shutil.rmtree(tmp, ignore_errors=True)
        if job.config.fail:
            (job.workdir / "model.onnx").write_bytes(b"broken")
        return {"summary": f"fake {job.stage.name}", "inputs": sorted(job.inputs)}
    return run


FAKES = {
    "source": Stage("source", "1", FakeConfig, (), lambda j: "hf-source", _writer("hf-source"), kind="source"),
    "quantize": Stage("quantize", "1", FakeConfig, ("source",), lambda j: "quark-export", _writer("quark-export"), kind="quark"),
    "export": Stage("export", "1", FakeConfig, ("quantize",), lambda j: "oga-export", _writer("oga-export"), kind="oga"),
    "fuse": Stage("fuse", "1", FakeConfig, ("export",), lambda j: "reference-16K", _writer("reference-16K"), kind="package"),
    "smoke": Stage("smoke", "1", FakeConfig, ("fuse",), lambda j: "reference-16K", _writer("reference-16K"), kind="package"),
}


def install() -> None:
    stage_mod.get = FAKES.__getitem__
