"""The stage contract: what a stage is (Stage) and what its run() gets (Job).
The registry that finds stages is the build runner's (pipeline/builder/stages.py)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol


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


class TargetProfile(Protocol):
    """The target package profile a job builds for (raipack.npu.spec.Profile, which core cannot name):
    stages read its id and hand it whole to the npu readers, which know its other fields."""

    @property
    def id(self) -> str: ...


class JobRecipe(Protocol):
    """What stages and the runner's helpers read of the build recipe (raipack.builder.recipe.Recipe)."""

    model: str | None  # the Hugging Face folder; None builds the example model
    profile: str  # the target profile's id
    output: str  # the folder the package is written into
    expected_answer: str | None  # what the smoke stage's answer must contain
    stages: dict[str, dict]  # each stage's table of options


class JobProgress(Protocol):
    """How a stage reports while it runs (raipack.builder.progress.Progress)."""

    def line(self, text: str, style: str = "") -> None:
        """One line for the user (`style`: a colour such as "yellow")."""

    def callback(self, description: str) -> Callable[[str, int, int], None]:
        """A `(what, done, total)` callback for code that reports its own steps."""

    def task(self, description: str, total: int | None = None) -> AbstractContextManager[Callable[..., None]]:
        """A long step: yields `advance(n=1)`."""

    def logged(self, stage: str, path: str) -> None:
        """The libraries wrote to `path` while `stage` ran (the runner's log capture)."""

    def writing_to(self, stream: Any) -> AbstractContextManager[None]:
        """Write to `stream` for a while (the runner's log capture)."""


@dataclass
class Job:
    """What a stage's run() gets."""

    stage: Stage
    config: Any
    inputs: dict[str, Path]
    workdir: Path
    profile: TargetProfile
    recipe: JobRecipe
    progress: JobProgress
    reports: dict[str, dict] = field(default_factory=dict)  # earlier stages' reports

