"""Keep the checks from reading a file a place did not fetch.

A Hub repository is validated from its file list and its small files: every other file is a
placeholder of its real size (sparse: a stat sees the Hub's size, no disk is spent), so the checks
that look only at names and sizes run as on a local copy. Opening a placeholder is refused while a
`watch` is on (a Python audit hook on "open": every open the checks make, through the package or
not), and the refusal is recorded against the check that tried; that check's findings are replaced by
one saying it was skipped and why.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
from contextlib import contextmanager

from raipack.core.findings import Finding

_lock = threading.Lock()
_state: dict = {"placeholders": {}, "who": None, "reads": None}
_installed = False


class NotFetched(PermissionError):
    """The open of a placeholder: its bytes were never downloaded."""


def _hook(event: str, args: tuple) -> None:
    if event != "open" or not _state["placeholders"]:
        return
    target = args[0] if args else None
    if isinstance(target, int) or target is None:
        return
    try:
        real = os.path.realpath(os.fsdecode(target))
    except (TypeError, ValueError):
        return
    rel = _state["placeholders"].get(real)
    if rel is None:
        return
    who = _state["who"]() if _state["who"] else ""
    _state["reads"].setdefault(who or "", set()).add(rel)
    raise NotFetched(errno.EACCES, "not downloaded (only the repository's file list and small files were fetched)", real)


@contextmanager
def watch(placeholders: dict[str, str], who=lambda: ""):
    """While on, opening any path of `placeholders` (real path → package rel) raises NotFetched;
    yields {check id or "" → the rels it tried}, `who()` naming the check running."""
    global _installed
    reads: dict[str, set[str]] = {}
    with _lock:
        if not _installed:
            sys.addaudithook(_hook)  # audit hooks cannot be removed: it does nothing while no watch is on
            _installed = True
        _state.update(placeholders={os.path.realpath(k): v for k, v in placeholders.items()}, who=who, reads=reads)
        try:
            yield reads
        finally:
            _state.update(placeholders={}, who=None, reads=None)


def skipped(findings: list[Finding], ran: list[str], reads: dict[str, set[str]], why) -> tuple[list[Finding], list[str]]:
    """The findings and checks run with every check that tried a placeholder taken out, and for each
    an info finding naming what it needed (`why(rels)`: the sentence)."""
    blocked = {cid: rels for cid, rels in reads.items() if cid}
    kept = [f for f in findings if f.check_id not in blocked]
    for cid, rels in sorted(blocked.items()):
        names = sorted(rels)
        kept.append(Finding(cid, "info", names[0], f"skipped: {why(names)}",
                            "download the repository (hf download) and validate its snapshot folder to run this check", members=tuple(names)))
    return kept, [cid for cid in ran if cid not in blocked]
