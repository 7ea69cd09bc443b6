"""The `fuse` stage: NPU post-processing of the OGA export, by raipack's open
`reference` backend or by AMD's `model_generate` (`ryzenai-sdk`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from raipack.core.errors import RaipackError, UsageError
from raipack.core.stage import Job, Stage
from raipack.npu.spec import Profile

SDK_KIND = "ryzenai-sdk-package"  # manifest kind of a package whose NPU files AMD's model_generate wrote


@dataclass(frozen=True)
class FuseConfig:
    backend: Literal["auto", "reference", "ryzenai-sdk"] = "auto"
    # ryzenai-sdk only: override the target profile's `sdk` block (model_generate's recipe, 16 GB laptops, extra options)
    recipe: Literal["full_fusion", "token_fusion", "eager", "basic"] | None = None
    mem_optimize: bool = False
    extra_options: dict | None = None

    def sdk_options(self) -> list[str]:
        """The [fuse] options set here that only the ryzenai-sdk backend reads."""
        return [name for name, value in (("recipe", self.recipe), ("mem_optimize", self.mem_optimize), ("extra_options", self.extra_options)) if value]


def reference_profile(target: Profile) -> str:
    """raipack's own package profile for a release target: the reference profile that extends it."""
    # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
    from raipack.npu import profile as profiles

    return profiles.reference_for(target).id


def choose_backend(requested: str) -> tuple[str, str]:
    # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
    from raipack.stages.fuse.sdk import find_module, find_tool

    if requested != "auto":
        return requested, f"--backend {requested}"
    module, refused = find_module()
    if refused:
        raise RaipackError(refused, "remove or rename that file, or run raipack from another folder")
    if module:
        return "ryzenai-sdk", f"AMD's model_generate Python module found at {module}"
    tool = find_tool()
    if tool:
        return "ryzenai-sdk", f"AMD's model_generate found at {tool}"
    return "reference", "AMD's model_generate is not installed (Windows-only); using raipack's open reference backend"


def run(job: Job) -> dict:
    # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
    from raipack.npu import profile as profiles

    backend, why = choose_backend(job.config.backend)
    job.progress.line(f"  fuse backend: {backend} ({why})")
    export = job.inputs["export"]
    quark = job.inputs.get("quantize")
    if backend == "ryzenai-sdk":
        # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
        from raipack.stages.fuse.sdk import call_settings, generate

        given = job.inputs.get(call_settings(job.profile, job.config)["input"]) or export  # hybrid: the Quark folder (AMD's flow exports for DirectML itself)
        report = generate(job.profile, given, job.workdir, job.config, untrusted=[p for p in job.inputs.values() if p])
        report["manifest_kind"] = SDK_KIND  # AMD's formats: not a package whose NPU files raipack wrote (the reference profiles' marker)
    else:
        # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
        from raipack.stages.fuse.reference import fuse

        report = fuse(export, job.workdir, profiles.get(reference_profile(job.profile)), quark_dir=quark, progress=job.progress.callback("fuse"))
        errors = [f for f in report.get("findings", []) if f.get("severity") == "error"]
        if errors:
            raise RaipackError(f"the model cannot go to the NPU as built: {errors[0]['message']}", errors[0].get("hint", ""))
    report["backend"], report["backend_reason"] = backend, why
    report.setdefault("summary", f"{backend} backend")
    return report


def output_profile(job: Job) -> str:
    backend, _ = choose_backend(job.config.backend)
    return job.profile.id if backend == "ryzenai-sdk" else reference_profile(job.profile)


def preflight(config: FuseConfig, target: Profile) -> None:
    """The reference backend builds only targets that have a reference profile and takes no model_generate
    options; the ryzenai-sdk backend only targets whose profile has an `sdk` block, extra options as strings."""
    backend, _ = choose_backend(config.backend)
    if backend == "reference":
        reference_profile(target)
        if config.sdk_options():
            raise UsageError(f"[fuse] {config.sdk_options()[0]} is an option of AMD's model_generate (the ryzenai-sdk backend); the reference backend writes the target profile's layout and takes none",
                             "remove it from the recipe, or build with --backend ryzenai-sdk on a machine with the Ryzen AI SDK")
        return
    # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
    from raipack.stages.fuse.sdk import call_settings

    call_settings(target, config)
    for key, value in (config.extra_options or {}).items():
        if not isinstance(value, str):
            raise UsageError(f"[fuse] extra_options.{key} is {value!r}; expected a string (model_generate takes every extra option as text)", f'write it as {key} = "{value}"')


STAGE = Stage(
    name="fuse",
    version="2",  # 2: writes prompts.txt
    config=FuseConfig,
    inputs=("export", "quantize"),
    output_profile=output_profile,
    run=run,
    tools=("onnx", "onnxruntime", "numpy", "model-generate"),
    kind="package",
    preflight=preflight,
)
