"""The `fuse` stage: NPU post-processing of the OGA export, by raipack's open
`reference` backend or by AMD's `model_generate` (`ryzenai-sdk`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.core.errors import RaipackError
from pipeline.core.stage import Job, Stage


@dataclass(frozen=True)
class FuseConfig:
    backend: Literal["auto", "reference", "ryzenai-sdk"] = "auto"


def reference_profile(target: dict) -> str:
    """raipack's own package profile for a release target: the reference profile that extends it."""
    from pipeline.npu import profile as profiles

    return profiles.reference_for(target)["id"]


def choose_backend(requested: str) -> tuple[str, str]:
    from stages.fuse.sdk import find_tool

    if requested != "auto":
        return requested, f"--backend {requested}"
    tool = find_tool()
    if tool:
        return "ryzenai-sdk", f"AMD's model_generate found at {tool}"
    return "reference", "AMD's model_generate is not installed (Windows-only); using raipack's open reference backend"


def run(job: Job) -> dict:
    from pipeline.npu import profile as profiles

    backend, why = choose_backend(job.config.backend)
    job.progress.line(f"  fuse backend: {backend} ({why})")
    export = job.inputs["export"]
    quark = job.inputs.get("quantize")
    if backend == "ryzenai-sdk":
        from stages.fuse.sdk import generate

        report = generate(job.profile, export, job.workdir)
    else:
        from stages.fuse.reference import fuse

        report = fuse(export, job.workdir, profiles.get(reference_profile(job.profile)), quark_dir=quark, progress=job.progress.callback("fuse"))
        errors = [f for f in report.get("findings", []) if f.get("severity") == "error"]
        if errors:
            raise RaipackError(f"the model cannot go to the NPU as built: {errors[0]['message']}", errors[0].get("hint", ""))
    report["backend"], report["backend_reason"] = backend, why
    report.setdefault("summary", f"{backend} backend")
    return report


def output_profile(job: Job) -> str:
    backend, _ = choose_backend(job.config.backend)
    return job.profile["id"] if backend == "ryzenai-sdk" else reference_profile(job.profile)


def preflight(config: FuseConfig, target: dict) -> None:
    """The reference backend builds only targets that have a reference profile (not hybrid ones)."""
    backend, _ = choose_backend(config.backend)
    if backend == "reference":
        reference_profile(target)


STAGE = Stage(
    name="fuse",
    version="1",
    config=FuseConfig,
    inputs=("export", "quantize"),
    output_profile=output_profile,
    run=run,
    tools=("onnx", "onnxruntime", "numpy"),
    kind="package",
    preflight=preflight,
)
