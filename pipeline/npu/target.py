"""A profile's target as an enum (the values of `target` in schemas/profile.schema.json, kept equal
by tests/test_pipeline/test_catalog.py), compared as `target_of(prof) is Target.REFERENCE`
instead of raw strings."""

from __future__ import annotations

from enum import Enum


class Target(str, Enum):
    """What kind of package a profile describes."""

    NPU = "npu"  # AMD's NPU-only packages
    HYBRID = "hybrid"  # AMD's NPU prefill + iGPU decode packages
    REFERENCE = "reference"  # raipack's reference packages (open formats)
    INTERMEDIATE = "intermediate"  # build inputs and stage outputs
    MODEL_PACKAGE = "model-package"  # an ONNX Runtime model package of packages

    @property
    def is_amd(self) -> bool:
        return self in (Target.NPU, Target.HYBRID)


def target_of(document: dict) -> Target:
    """The target of a profile document as written (code holding a loaded profile reads `profile.target`)."""
    return Target(document["target"])
