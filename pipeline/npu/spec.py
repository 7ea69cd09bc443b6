"""A profile as the code reads it: a frozen, typed view of one resolved profile document
(schemas/profile.schema.json), built once when the profile is loaded and checked against that
schema. Code reads attributes (`profile.genai.search`, `profile.buckets.token`,
`profile.target is Target.HYBRID`), never the document's keys; the document itself
(`profile.document()`, a fresh copy) is only for hashing, cache keys and JSON output."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from raipack.core import schemas
from raipack.core.errors import UsageError
from raipack.npu.target import Target

MISSING: Any = object()  # a condition without `equals`


def frozen(value):
    """A JSON value that cannot be changed: objects as read-only mappings, arrays as tuples."""
    if isinstance(value, dict):
        return MappingProxyType({k: frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(frozen(v) for v in value)
    return value


def _strings(values) -> tuple[str, ...]:
    return tuple(values or ())


@dataclass(frozen=True)
class Condition:
    """One detection condition: {file, pointer, equals | gt | le | exists}, {ryzenai, equals},
    {exists: glob} or {absent: glob}."""

    why: str = "marker holds"
    file: str | None = None
    pointer: str | None = None
    ryzenai: str | None = None
    equals: Any = MISSING
    gt: float | None = None
    le: float | None = None
    exists: bool | str | None = None  # a bool beside `file`; alone, a glob that must match a file or folder
    absent: str | None = None

    @classmethod
    def of(cls, doc: dict) -> Condition:
        return cls(why=doc.get("why", "marker holds"), file=doc.get("file"), pointer=doc.get("pointer"), ryzenai=doc.get("ryzenai"),
                   equals=frozen(doc["equals"]) if "equals" in doc else MISSING, gt=doc.get("gt"), le=doc.get("le"),
                   exists=doc.get("exists"), absent=doc.get("absent"))


@dataclass(frozen=True)
class Detect:
    name_patterns: tuple[str, ...]
    content: tuple[Condition, ...]

    def why(self) -> str:
        return "; ".join(c.why for c in self.content)


@dataclass(frozen=True)
class Files:
    required: tuple[str, ...]
    required_one_of: tuple[tuple[str, ...], ...]
    recommended: tuple[str, ...]


@dataclass(frozen=True)
class OptionRule:
    """What a profile says of one RyzenAI option."""

    required: bool = False
    allowed: tuple[str, ...] | None = None
    power_of_two: bool = False
    build: str | None = None  # the value raipack's reference backend writes (a template over the lengths)
    doc: str = ""


@dataclass(frozen=True)
class Genai:
    form: str  # builder, session_options or provider_options
    options: Mapping[str, OptionRule]
    search: Mapping[str, Any]  # the values genai_config.json's search block should have


@dataclass(frozen=True)
class Metastate:
    required: bool
    siblings: tuple[str, ...]
    optional_siblings: tuple[str, ...]
    tiered: bool
    ship_together: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class Buckets:
    prefill: tuple[int, ...]
    token: tuple[int, ...]

    def of(self, phase: str) -> tuple[int, ...]:
        """The tiers of `phase` ("prefill" or "token")."""
        return self.prefill if phase == "prefill" else self.token

    def as_dict(self) -> dict[str, list[int]]:
        return {"prefill": list(self.prefill), "token": list(self.token)}


@dataclass(frozen=True)
class Layout:
    """The decoder file names where they differ from model.onnx / model.onnx.data / model.pb.bin."""

    graph: str | None = None
    data: str | None = None
    header: str | None = None
    prefill_pass: int | None = None  # a tierless layout's longest NPU prefill pass


@dataclass(frozen=True)
class Quantization:
    required: bool
    group_size: int
    bits: int
    symmetric: bool
    config_json: str  # quark, empty or either
    allowed_group_sizes: tuple[int, ...] | None = None
    lm_head_group_sizes: tuple[int, ...] | None = None
    npu_k_multiple: int = 1
    npu_n_multiple: int = 1

    def group_sizes(self) -> tuple[int, ...]:
        """The weight group sizes accepted: `allowed_group_sizes`, else the one `group_size`."""
        return self.allowed_group_sizes or (self.group_size,)


@dataclass(frozen=True)
class Advice:
    """Tuning advice blocks (each a read-only mapping shaped as the schema says; None: that advice is off)."""

    token_backend: Mapping | None = None
    kv_cache_fusion: Mapping | None = None
    share_buffer: Mapping | None = None
    chunked_prefill: Mapping | None = None
    max_length: Mapping | None = None
    sdk_prompt: Mapping | None = None
    sampling: Mapping | None = None
    padding: Mapping | None = None


@dataclass(frozen=True)
class Sdk:
    """How the ryzenai-sdk fuse backend calls AMD's model_generate."""

    mode: str
    input: str = "export"
    recipe: str | None = None
    mem_optimize: bool = False
    extra_options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, eq=False)
class Profile:
    id: str
    title: str
    release: str
    target: Target
    fusion: str | None
    context: int | None
    detect: Detect
    files: Files
    genai: Genai
    metastate: Metastate
    buckets: Buckets
    max_prompt_length: Mapping[str, int]
    quantization: Quantization
    layout: Layout
    advice: Advice
    sdk: Sdk | None
    extends: str | None
    model_overrides: Mapping[str, Mapping]
    notes: str
    source: str  # where the document came from, for error sentences
    text: str  # the resolved document as canonical JSON

    def document(self) -> dict:
        """A fresh copy of the resolved document: for hashing, cache keys and JSON output only."""
        return json.loads(self.text)

    @property
    def tierless(self) -> bool:
        """A layout compiled for no sequence-length tiers (the hybrid packages: decode runs on the iGPU)."""
        return not self.buckets.prefill and not self.buckets.token

    def __eq__(self, other) -> bool:
        return isinstance(other, Profile) and self.text == other.text

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"Profile({self.id!r})"

    def __reduce__(self):
        """Pickled as its document (a process pool's worker rebuilds the view; read-only mappings do not pickle)."""
        return _typed, (self.document(), self.source)


class ProfileError(UsageError):
    """A profile document that lacks a field the code reads, or breaks the profile schema."""


def build(doc: dict, source: str) -> Profile:
    """The typed view of a resolved profile document; a document that breaks the profile schema
    fails here with one sentence naming `source` and the field."""

    problems = schemas.errors("profile", doc)
    if problems:
        _, sentence = problems[0]  # the sentence names the field by its JSON pointer
        raise ProfileError(f"profile {doc.get('id', '?')} ({source}): {sentence}",
                           "fix the profile file (schemas/profile.schema.json says what each field takes)")
    return _typed(doc, source)


def _typed(doc: dict, source: str) -> Profile:
    genai, meta, q, buckets = doc["genai"], doc["metastate"], doc["quantization"], doc["buckets"]
    sdk = doc.get("sdk")
    return Profile(
        id=doc["id"], title=doc["title"], release=doc["release"], target=Target(doc["target"]), fusion=doc["fusion"], context=doc["context"],
        detect=Detect(_strings(doc["detect"]["name_patterns"]), tuple(Condition.of(c) for c in doc["detect"]["content"])),
        files=Files(_strings(doc["files"]["required"]), tuple(_strings(g) for g in doc["files"]["required_one_of"]), _strings(doc["files"]["recommended"])),
        genai=Genai(genai["form"], MappingProxyType({k: _rule(v) for k, v in genai["options"].items()}), frozen(genai["search"])),
        metastate=Metastate(meta["required"], _strings(meta["siblings"]), _strings(meta["optional_siblings"]), meta["tiered"],
                            tuple(_strings(g) for g in meta.get("ship_together", ()))),
        buckets=Buckets(tuple(buckets["prefill"]), tuple(buckets["token"])),
        max_prompt_length=MappingProxyType(dict(doc["max_prompt_length"])),
        quantization=Quantization(q["required"], q["group_size"], q["bits"], q["symmetric"], q["config_json"],
                                  _ints(q.get("allowed_group_sizes")), _ints(q.get("lm_head_group_sizes")),
                                  int(q.get("npu_k_multiple", 1)), int(q.get("npu_n_multiple", 1))),
        layout=Layout(**doc.get("layout", {})),
        advice=Advice(**{k: frozen(v) for k, v in doc.get("advice", {}).items()}),
        sdk=Sdk(sdk["mode"], sdk.get("input", "export"), sdk.get("recipe"), bool(sdk.get("mem_optimize", False)),
                MappingProxyType(dict(sdk.get("extra_options", {})))) if sdk else None,
        extends=doc.get("extends"), model_overrides=frozen(doc.get("model_overrides", {})), notes=doc.get("notes", ""),
        source=source, text=json.dumps(doc, sort_keys=True))


def _ints(values) -> tuple[int, ...] | None:
    return tuple(int(v) for v in values) if values else None


def _rule(doc: dict) -> OptionRule:
    return OptionRule(bool(doc.get("required", False)), _strings(doc["allowed"]) if "allowed" in doc else None,
                      bool(doc.get("power_of_two", False)), doc.get("build"), doc.get("doc", ""))
