"""Text from a package made safe to print: every reporter and `inspect` pass
file names and values through here.

A name or value from a package may hold terminal escapes (ESC, C1 controls),
bidi overrides, bytes that are not UTF-8, or be megabytes long. `safe()`
returns one printable line:
- each character Python does not call printable (C0 and C1 controls, DEL,
  format characters such as bidi overrides and zero-width spaces, line and
  paragraph separators, unassigned and private-use code points) becomes
  `\\xNN` (below U+0080), `\\uNNNN` or `\\UNNNNNNNN`;
- each byte of a file name that is not UTF-8 (decoded by Python as a lone
  surrogate, os.fsdecode's surrogateescape) becomes `\\xNN` with NN >= 80, so
  it is told apart from a character (`\\u0080`...);
- text longer than `limit` characters keeps its start and end around
  `…(N characters)…`.
The result encodes as strict UTF-8 and is legal in XML 1.0.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import islice

LIMIT = 500  # characters of one message, hint or value in a report
PATH_LIMIT = 1024  # characters of a file name or the validated folder
MAX_DEPTH = 16  # nesting shown of a value (inspect)
MAX_ITEMS = 64  # items shown of a list or dict (inspect)


def _code(ch: str) -> str:
    o = ord(ch)
    if 0xDC80 <= o <= 0xDCFF:
        return f"\\x{o - 0xDC00:02x}"
    if o < 0x80:
        return f"\\x{o:02x}"
    return f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}"


def escape(text: str) -> str:
    """Printable characters kept, every other one written as an escape."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _code(ch) for ch in text)


def safe(value, limit: int = LIMIT) -> str:
    """`value` as one printable line of at most about `limit` characters."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        text = escape(text)
        if len(text) <= limit:
            return text
    head, tail = limit * 2 // 3, limit // 3
    return f"{escape(text[:head])[:head]}…({len(text)} characters)…{escape(text[-tail:])[-tail:]}"


def safe_tree(value, limit: int = LIMIT, markup: bool = False, depth: int = 0):
    """A JSON-like value with every string (keys too) made safe, nesting cut at
    MAX_DEPTH and lists and dicts at MAX_ITEMS; `markup` also escapes rich
    markup (for text printed by rich)."""
    if isinstance(value, str):
        text = safe(value, limit)
        if markup:
            from rich.markup import escape as markup_escape

            text = markup_escape(text)
        return text
    if isinstance(value, (dict, list, tuple)):
        if depth >= MAX_DEPTH:
            return f"…({type(value).__name__} nested deeper than {MAX_DEPTH})"
        more = len(value) - MAX_ITEMS
        items = list(islice(value.items() if isinstance(value, dict) else value, MAX_ITEMS))
        if isinstance(value, dict):
            out = {safe_tree(k, limit, markup, depth + 1) if isinstance(k, str) else k: safe_tree(v, limit, markup, depth + 1) for k, v in items}
            if more > 0:
                out["…"] = f"{more} more"
            return out
        seq = [safe_tree(v, limit, markup, depth + 1) for v in items]
        return seq + [f"…({more} more)"] if more > 0 else seq
    return value


def safe_finding(f):
    return replace(f, path=safe(f.path, PATH_LIMIT), message=safe(f.message), hint=safe(f.hint), pointer=safe(f.pointer),
                   members=tuple(safe(m) for m in f.members))


def safe_results(results) -> list:
    """Copies of validation results (pipeline/core/findings.py) whose every text
    field is safe to print or write; what each reporter formats."""
    return [replace(r, root=safe(r.root, PATH_LIMIT), profile=safe(r.profile), profile_reason=safe(r.profile_reason),
                    findings=[safe_finding(f) for f in r.findings]) for r in results]
