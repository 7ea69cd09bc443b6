"""Running a Windows-built package on Linux, as AMD documents it per release (the catalog's `linux`
block, from docs/llm_linux.rst of each release branch): which of the package's files still need the
documented edit, and what each edited file becomes. Reads with the package's caps; writes nothing."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from raipack.core.package import JSON_MAX_BYTES, Package, ReadError
from raipack.npu import catalog
from raipack.npu.spec import Profile
from raipack.npu.target import Target

_MISSING = object()


@dataclass(frozen=True)
class Pending:
    """One documented edit the package's file does not have yet."""

    file: str
    what: str  # one line: the setting or lines, now and on Linux
    why: str
    install_path: bool  # the value names the user's install (a folder relative to where the program runs)
    pointer: str = ""  # a JSON pointer of `file` set to `value`; empty for a text edit
    value: str = ""


def deployment(release: str | None) -> dict | None:
    """The catalog's Linux deployment of `release` (None: AMD documents none)."""
    entry = catalog.entry(release) if release and release != "n/a" else None
    return (entry or {}).get("linux")


def _pointer_get(doc, pointer: str):
    node = doc
    for part in pointer.strip("/").split("/"):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _slashed(text: str, marker: str) -> str:
    """AMD's Linux step: backslashes become slashes in every line that names `marker`. In JSON text a
    Windows separator is an escaped pair, which becomes one slash (AMD's script, replacing each
    backslash, writes two, the same path on Linux)."""
    return "".join(line.replace("\\\\", "/").replace("\\", "/") if marker in line else line for line in text.splitlines(keepends=True))


def pending(pkg: Package, release: str | None) -> list[Pending]:
    """The documented Linux edits `pkg`'s files do not have yet (empty: none documented, or all done)."""
    out: list[Pending] = []
    for edit in (deployment(release) or {}).get("package_edits", []):
        if "pointer" in edit:
            doc = pkg.try_json(edit["file"])
            now = _pointer_get(doc, edit["pointer"]) if isinstance(doc, dict) else _MISSING
            if isinstance(doc, dict) and now != edit["value"]:
                shown = "absent" if now is _MISSING else repr(now)
                out.append(Pending(edit["file"], f"{edit['pointer']} is {shown}; on Linux {edit['value']!r}", edit["why"],
                                   edit["install_path"], edit["pointer"], edit["value"]))
            continue
        for rel in sorted(r for r in pkg.files if fnmatch.fnmatchcase(r, edit["files"])):
            text = meta_text(pkg, rel)
            if text is not None and _slashed(text, edit["slashes_in_lines_with"]) != text:
                lines = sum("\\" in line and edit["slashes_in_lines_with"] in line for line in text.splitlines())
                out.append(Pending(rel, f"{lines} line(s) name {edit['slashes_in_lines_with']} files with backslashes; on Linux /", edit["why"], edit["install_path"]))
    return out


def meta_text(pkg: Package, rel: str) -> str | None:
    try:
        return pkg.read_bytes(rel, JSON_MAX_BYTES, "cache meta file").decode("utf-8")
    except (ReadError, UnicodeDecodeError):
        return None


def edited_text(pkg: Package, release: str | None, rel: str, text: str) -> str:
    """`text` (the file `rel`) with every text edit of the release applied (JSON edits: the caller's)."""
    for edit in (deployment(release) or {}).get("package_edits", []):
        if "files" in edit and fnmatch.fnmatchcase(rel, edit["files"]):
            text = _slashed(text, edit["slashes_in_lines_with"])
    return text


def refusal(profile: Profile) -> tuple[str, str, str] | None:
    """(severity, sentence, hint) when AMD's docs say the package does not run on Linux (error), or
    say nothing about packages of its kind (warning); None when its Linux steps are documented."""
    release = profile.release
    if not release or release == "n/a":
        return None
    plan = deployment(release)
    if plan is None:
        return ("warning", f"AMD documents no Linux deployment for Ryzen AI {release} packages; whether this one runs on Linux is unknown",
                "run it on Windows, or see AMD's docs/llm_linux.rst of its release")
    if profile.target is not Target.HYBRID or plan.get("hybrid") is True:
        return None
    if plan.get("hybrid") is False:
        return ("error", f"is a hybrid package, and Ryzen AI {release} runs no hybrid package on Linux ({plan['source']})",
                "take the release's NPU package (4K or 16K) for Linux")
    return ("warning", f"is a hybrid package; AMD's Linux steps for Ryzen AI {release} cover its NPU packages only ({plan['source']})",
            "take the release's NPU package for Linux, or run this one on Windows")
