"""The stage contract: what a stage is (Stage) and what its run() gets (Job).
The registry that finds stages is the build runner's (pipeline/builder/stages.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class MemoryEstimate:
    """What a stage will need at its peak, estimated from config.json and its options before it loads anything.

    `basis` says what the number counts, for the runner's refusal sentence; `hint(available_bytes)`, when
    the stage knows a cheaper setting, says it; `details` go into the stage report beside the measured peak."""

    bytes: int
    basis: str
    device: str = "cpu"
    hint: Callable[[int], str] | None = None
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Stage:
    """One build step.

    `run(job)` reads `job.inputs` (upstream outputs by stage name), writes
    into `job.workdir` and nothing else, and returns its report (JSON-able).
    The runner alone stages: it made `job.workdir` (new, empty), and then
    validates it against `output_profile`, renames it into place and writes
    the manifest. A stage never replaces or renames its folder.
    """

    name: str
    version: str
    config: type  # a dataclass; unknown keys are refused
    inputs: tuple[str, ...]
    output_profile: Callable[["Job"], str | None]  # None: the output is a report the stage checked itself
    run: Callable[["Job"], dict]
    tools: tuple[str, ...] = ()  # distributions whose versions enter the cache key
    kind: str = ""  # the manifest's kind
    profile_keys: tuple[str, ...] | None = None  # the target profile's keys the output depends on (None: all of it)
    preflight: Callable[[Any, dict], None] | None = None  # (config, target profile): refuse before any stage runs
    # (config, the model's config.json or None, target profile): its peak before it loads anything; None: the registry's
    # allowance rule (pipeline/data/stage_memory.json)
    memory: Callable[[Any, dict | None, dict], MemoryEstimate] | None = None

    def profile_part(self, document: dict) -> dict:
        """What of the target profile's document (`Profile.document()`) enters this stage's cache key."""
        return document if self.profile_keys is None else {k: document.get(k) for k in self.profile_keys}


@dataclass
class Job:
    """What a stage's run() gets."""

    stage: Stage
    config: Any
    inputs: dict[str, Path]
    workdir: Path
    profile: Any  # the target package profile (raipack.npu.spec.Profile)
    recipe: Any
    progress: Any
    reports: dict[str, dict] = field(default_factory=dict)  # earlier stages' reports

