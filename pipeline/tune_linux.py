"""`raipack tune --platform linux`: AMD's documented edits for running a Windows-built package on
Linux, planned (nothing written), applied with a backup of each file, and the package validated for
Linux after. The length settings are tuned by pipeline/tune.py, whose refusal, backup and JSON
layout this shares."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from raipack.core.errors import RaipackError
from raipack.core.output import atomic_write_bytes
from raipack.core.package import JSON_MAX_BYTES, Package, ReadError
from raipack.npu import linux
from raipack.tune import Refused, backup_path, dump_like
from raipack.validate import open_package, validate


@dataclass
class LinuxPlan:
    root: Path
    profile: str
    reason: str
    release: str
    source: str
    pending: list  # raipack.npu.linux.Pending, each edit the files lack
    texts: dict[str, tuple[str, str]]  # file -> (old text, new text)
    environment: list[str]  # what the user sets up beside the package (not file edits)


def plan_linux(path: Path, profile: str = "auto") -> LinuxPlan:
    """The edits AMD documents for the package's release on Linux, computed, nothing written;
    Refused when AMD documents no Linux deployment for the release (raipack does not guess one)."""

    ctx, reason = open_package(path, profile)
    prof, release = ctx.profile, ctx.profile.release
    stop = linux.refusal(prof) or (None if release != "n/a" else ("error", f"is not a Ryzen AI release package (profile {prof.id})",
                                                                   "tune --platform linux edits AMD's release packages"))
    if stop is not None:
        raise Refused(f"{path} {stop[1]}; raipack will not guess Linux edits", stop[2])
    plan = linux.deployment(release)
    todo = linux.pending(ctx.pkg, release)
    texts = {}
    for rel in dict.fromkeys(p.file for p in todo):
        try:
            old = ctx.pkg.read_bytes(rel, JSON_MAX_BYTES, "config file").decode("utf-8-sig")
        except (ReadError, UnicodeDecodeError) as exc:
            raise Refused(f"{ctx.pkg.root / rel} cannot be edited: {exc}; nothing was written", "copy the package again") from None
        edits = [p for p in todo if p.file == rel and p.pointer]
        if edits:
            doc = json.loads(old)
            for edit in edits:
                _set_pointer(doc, edit.pointer, edit.value)
            new = dump_like(doc, old)
        else:
            new = linux.edited_text(ctx.pkg, release, rel, old)
        texts[rel] = (old, new)
    return LinuxPlan(ctx.pkg.root, prof.id, reason, release, plan["source"], todo, texts, list(plan.get("environment", [])))


def _set_pointer(doc: dict, pointer: str, value) -> None:
    node = doc
    parts = pointer.strip("/").split("/")
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


def apply_linux(p: LinuxPlan) -> list[tuple[str, Path]]:
    """Back up and atomically replace each edited file (same mode, through in-package links);
    (file, backup) for each. A file that changed since the plan stops the run before it is touched."""
    done = []
    pkg = Package(p.root)
    for rel, (old, new) in p.texts.items():
        try:
            original = pkg.read_bytes(rel, JSON_MAX_BYTES, "config file")
        except ReadError as exc:
            raise Refused(f"{p.root / rel} {exc}; {len(done)} file(s) written before it", exc.hint) from None
        if original.decode("utf-8-sig", "replace") != old:
            raise RaipackError(f"{p.root / rel} changed while raipack tune was running", "run raipack tune --platform linux again")
        target = Path(os.path.realpath(p.root / rel))
        mode = os.stat(target)
        backup = backup_path(p.root / rel)
        atomic_write_bytes(backup, original, like=mode)
        atomic_write_bytes(target, new.encode("utf-8"), like=mode)
        done.append((rel, backup))
    return done


def revalidate_linux(p: LinuxPlan):

    return validate(p.root, p.profile, platform="linux")
