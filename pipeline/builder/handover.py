"""The hand-over: stage outputs carried from one machine to another, checked by digest before use.

AMD's model_generate runs on Windows only; Quark and the model builder run anywhere. So a build
can stop after `export` on one machine (`raipack build --until export --handover DIR`) and go on
on another (`raipack build --inputs DIR --backend ryzenai-sdk`). DIR is self-contained: real copies
of the outputs the remaining stages need (for `--until export`, quantize and export: fuse reads
both), each with its manifest, and `handover.json`: the resolved recipe, the target profile, each
carried stage's cache key and folder digest (pipeline/builder/cache.py: folder_digest, the sha256 of
its manifest), the tool versions. Paths in it are relative to DIR, so the folder can be moved.

Before a carried output is used, its manifest must have the recorded digest and every file the
sha256 its manifest records (no file added, none missing, no symlink); else one sentence names the
stage and the file, and nothing is built.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from raipack import __version__
from raipack.builder import cache, stages
from raipack.builder.config import parse_config
from raipack.builder.recipe import layered, load
from raipack.core import manifest
from raipack.core.errors import RaipackError, UsageError
from raipack.core.jsonread import loads_strict
from raipack.core.output import atomic_write_text, copy_tree
from raipack.core.package import ReadError, read_regular
from raipack.npu.spec import Profile

FILE = "handover.json"
FORMAT = "raipack-handover"
TOOLS = ("torch", "amd-quark", "transformers", "onnx", "onnxruntime", "onnxruntime-genai")
MAKE_HINT = "make one with `raipack build --until export --handover DIR` and copy DIR whole"


@dataclass
class Carried:
    """A stage output carried in a hand-over folder."""

    stage: str
    path: Path
    cache_key: str
    sha256: str


@dataclass
class Handover:
    folder: Path
    doc: dict
    outputs: dict[str, Carried] = field(default_factory=dict)

    @property
    def next(self) -> str:
        return self.doc["next"]


def profile_digest(profile: Profile) -> str:
    """The digest of the resolved profile document (canonical JSON, keys sorted)."""
    return hashlib.sha256(json.dumps(profile.document(), sort_keys=True).encode()).hexdigest()


def needed_after(until: str) -> list[str]:
    """The stages up to `until` whose outputs the stages after it read."""
    names = stages.order()
    end = names.index(until) + 1
    need = {i for n in names[end:] for i in stages.get(n).inputs}
    return [n for n in names[:end] if n in need]


def check_destination(dest: Path, until: str | None = None) -> None:
    """Before a build spends minutes: something to carry after `until` (when given), the hand-over
    folder new or empty, the nearest existing folder above it writable."""
    dest = Path(dest)
    if until is not None and not needed_after(until):
        raise UsageError(f"--handover: no stage after {until} needs an output of this build, so there is nothing to carry", "build with --until export --handover DIR")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(f"--handover {dest} exists and is not an empty folder", "name a new folder; a hand-over is never written over other files")
    parent = dest.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--handover {dest}: {parent} is not writable", "choose another folder")


def write(dest: Path, result) -> Path:
    """Copy the outputs the remaining stages need out of `result` (a BuildResult) into `dest`, then write handover.json."""
    dest = Path(dest)
    check_destination(dest)
    if not result.stages:
        raise UsageError("--handover: the build ran no stage", "build with --until export --handover DIR")
    last = result.stages[-1].name
    carry = [r for r in result.stages if r.name in needed_after(last)]
    if not carry:
        raise UsageError(f"--handover: no stage after {last} needs an output of this build, so there is nothing to carry", "build with --until export --handover DIR")
    work = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    cache.remove(work)
    work.mkdir(parents=True)
    try:
        entries = []
        for r in carry:
            copy_tree(Path(r.path), work / r.name, ignore=())
            digest = cache.folder_digest(work / r.name)
            if digest != cache.folder_digest(Path(r.path)):
                raise RaipackError(f"--handover: the copy of the {r.name} output ({r.path}) differs from it", "check the disk and run again")
            entries.append({"stage": r.name, "path": r.name, "version": stages.get(r.name).version, "cache_key": r.key, "sha256": digest})
        atomic_write_text(work / FILE, json.dumps(describe(result, last, entries), indent=2) + "\n")
        if dest.exists():
            dest.rmdir()  # empty (checked above)
        os.rename(work, dest)
    except BaseException:
        cache.remove(work)
        raise
    return dest


def describe(result, last: str, entries: list[dict]) -> dict:
    names = stages.order()
    recipe = result.recipe
    return {
        "format": FORMAT, "format_version": 1,
        "generator": {"name": "raipack", "version": __version__},
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "recipe": {"name": recipe.model_name(), "profile": recipe.profile, "expected_answer": recipe.expected_answer,
                   "trust_remote_code": recipe.trust_remote_code, "stages": {k: v for k, v in recipe.stages.items() if v}},
        "profile": {"id": result.profile.id, "sha256": profile_digest(result.profile)},
        "until": last, "next": names[names.index(last) + 1],
        "stages": entries,
        "tools": manifest.tool_versions(TOOLS),
    }


MAX_BYTES = 16 << 20  # a hand-over file is a few KiB: its recipe, stage digests and tool versions


def read(folder: Path) -> Handover:
    """The hand-over in `folder`, every carried output checked against its digest and manifest."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"--inputs {folder} is not a folder", MAKE_HINT)
    path = folder / FILE
    try:
        raw = read_regular(path, MAX_BYTES)
        if len(raw) > MAX_BYTES:
            raise UsageError(f"{path} is larger than the {MAX_BYTES} bytes a hand-over file takes", MAKE_HINT)
        doc = loads_strict(raw.decode("utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--inputs {folder} has no {FILE}, so it is not a raipack hand-over folder", MAKE_HINT) from None
    except ReadError as exc:
        raise UsageError(f"{path}: {exc}", MAKE_HINT) from None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise UsageError(f"{path} cannot be read as JSON: {exc}", MAKE_HINT) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("format_version") != 1:
        raise UsageError(f"{path} is not a raipack hand-over (format {FORMAT}, version 1)", MAKE_HINT)
    try:
        entries = [(e["stage"], e["path"], e["cache_key"], e["sha256"]) for e in doc["stages"]]
        doc["recipe"]["profile"], doc["next"]  # present, or the KeyError below
    except (KeyError, TypeError):
        raise UsageError(f"{path} lacks a field raipack writes (stages[].stage/path/cache_key/sha256, recipe.profile, next)", MAKE_HINT) from None
    known = stages.order()
    for i, (stage, rel, key, digest) in enumerate(entries):
        if stage not in known:
            raise UsageError(f"{path}: stages[{i}].stage {stage!r} is not a stage; expected one of {', '.join(known)}", MAKE_HINT)
        if not all(isinstance(v, str) for v in (rel, key, digest)):
            raise UsageError(f"{path}: stages[{i}] path, cache_key and sha256 are not all strings", MAKE_HINT)
    _check_stage_tables(path, doc["recipe"].get("stages"))
    handover = Handover(folder, doc)
    for stage, rel, key, digest in entries:
        handover.outputs[stage] = _checked(folder, path, stage, rel, key, digest)
    return handover


def _check_stage_tables(path: Path, tables) -> None:
    """The carried recipe's stage options, each a known option of a known stage (they were accepted silently)."""
    if tables is None:
        return
    if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
        raise UsageError(f"{path}: recipe.stages is not a table of stage tables", MAKE_HINT)
    for name, table in tables.items():
        if name not in stages.order():
            raise UsageError(f"{path}: recipe.stages.{name} is not a stage; expected one of {', '.join(stages.order())}", MAKE_HINT)
        parse_config(stages.get(name).config, table, f"{path}: recipe.stages.{name}")


def _checked(folder: Path, path: Path, stage: str, rel: str, key: str, digest: str) -> Carried:
    where = folder / rel
    if Path(rel).is_absolute() or ".." in Path(rel).parts or not where.is_dir() or os.path.realpath(where) != os.path.join(os.path.realpath(folder), os.path.normpath(rel)):
        raise UsageError(f"{path}: stages[{stage}].path {rel!r} is not a folder inside the hand-over", MAKE_HINT)
    links = [p for p in where.rglob("*") if p.is_symlink()]
    if links:
        raise RaipackError(f"the carried {stage} output {where} holds a symlink ({links[0].relative_to(where)}); a hand-over carries real files only", MAKE_HINT)
    doc = manifest.read(where)
    if doc is None or cache.folder_digest(where) != digest:
        raise RaipackError(f"the carried {stage} output {where} does not have the digest {FILE} records ({manifest.NAME} is missing or was changed)", MAKE_HINT)
    problem = cache.changed_file(where, doc)
    if problem:
        raise RaipackError(f"the carried {stage} output {where} was changed after the hand-over was made: {problem}", MAKE_HINT)
    return Carried(stage, where.resolve(), key, digest)


def recipe_from(handover: Handover, recipe_path, overrides: dict):
    """The recipe the hand-over carries, with the command line's flags over it (not the model or the target)."""
    if recipe_path is not None:
        raise UsageError("--recipe and --inputs together: the hand-over carries its recipe", "drop --recipe; flags such as --backend still apply")
    doc = handover.doc["recipe"]
    for key, why in (("model", "the hand-over carries the model's outputs; no model folder is needed"),
                     ("profile", f"the carried outputs were built for {doc['profile']}")):
        if overrides.get(key) not in (None, doc.get(key)):
            raise UsageError(f"--inputs {handover.folder}: a {key} was given ({overrides[key]}), but {why}", "drop it")
    carried = {"name": doc.get("name"), "profile": doc["profile"], "trust_remote_code": doc.get("trust_remote_code"), **(doc.get("stages") or {})}
    recipe = load(None, layered({k: v for k, v in carried.items() if v is not None}, overrides))
    recipe.expected_answer = doc.get("expected_answer")
    return recipe


def profile_drift(handover: Handover, profile: Profile) -> str:
    """A line when this raipack's target profile is not the one the hand-over was made with ("" when it is)."""
    made = handover.doc.get("profile") or {}
    if made.get("sha256") in (None, profile_digest(profile)):
        return ""
    return (f"warning: profile {profile.id} here differs from the one the hand-over was made with (raipack "
            f"{handover.doc.get('generator', {}).get('version', '?')}); the remaining stages use this one")


def check_plan(handover: Handover, names: list[str], from_: str) -> list[str]:
    """The stages before `from_` the build takes from the hand-over; refuse one the stages from `from_` on need and it lacks."""
    start = names.index(from_)
    for name in names[start:]:
        for i in stages.get(name).inputs:
            if names.index(i) < start and i not in handover.outputs:
                raise UsageError(f"--from {from_}: the hand-over in {handover.folder} does not carry the output of {i}, which stage {name} needs",
                                 f"start at {handover.next} (the hand-over carries {', '.join(handover.outputs)}), or make a hand-over that carries {i}")
    return [n for n in names[:start] if n in handover.outputs]


def lineage(handover: Handover, stage: str) -> dict:
    """What a manifest's lineage says about a carried input."""
    c = handover.outputs[stage]
    return {"carried": True, "handover": str(handover.folder.resolve() / FILE), "sha256": c.sha256, "cache_key": c.cache_key}
