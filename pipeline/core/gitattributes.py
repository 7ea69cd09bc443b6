"""Which attributes git gives a path, from the `.gitattributes` files of a folder, without running git.

Written after git's own rules (gitattributes(5), gitignore(5) "PATTERN FORMAT", and the code that
applies them: attr.c, dir.c `match_basename`/`match_pathname`, wildmatch.c), because whether the
Hub stores a file in LFS is whatever git computes for its `filter` attribute:

- a line is `pattern attr...`, split at spaces and tabs; blank lines and lines starting with `#`
  are skipped; a pattern starting with `"` is a C-style quoted string; a line longer than 2048
  bytes is ignored, as git ignores it (attr.c `ATTR_MAX_LINE_LENGTH`);
- `attr` sets, `-attr` unsets, `!attr` makes unspecified, `attr=value` gives a value; `binary` is
  git's built-in macro for `-diff -merge -text`; `[attr]name ...` defines a macro (top-level file
  only);
- a pattern starting with `!` is refused by git ("Negative patterns are ignored"): skipped here too;
- a pattern with no `/` (a trailing one aside) matches the file name at any depth; any other is
  anchored to the folder of its `.gitattributes` (a leading `/` only anchors) and `*`, `?` and
  `[...]` never match a `/`; `**/`, `/**/` and `/**` match across folders, any other `**` is `*`;
- a pattern with a trailing `/` matches only folders, and a folder's attributes are not inherited
  by the files in it, so such a pattern gives a file nothing;
- for each attribute, the last matching line wins; a `.gitattributes` deeper in the tree wins over
  one nearer the root; matching is case-sensitive (the Hub's git is).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_LINE = 2048  # attr.c ATTR_MAX_LINE_LENGTH
MAX_BYTES = 100 * 1024 * 1024  # attr.c ATTR_MAX_FILE_SIZE: a larger file is ignored by git
MACROS = {"binary": (("diff", False), ("merge", False), ("text", False))}
UNSPECIFIED = None
_CLASSES = {
    "alnum": r"a-zA-Z0-9", "alpha": r"a-zA-Z", "blank": r" \t", "cntrl": r"\x00-\x1f\x7f", "digit": r"0-9",
    "graph": r"!-~", "lower": r"a-z", "print": r" -~", "punct": r"!-/:-@\[-`{-~", "space": r" \t\n\r\f\v",
    "upper": r"A-Z", "xdigit": r"0-9A-Fa-f",
}


@dataclass(frozen=True)
class Rule:
    pattern: str  # as git reads it (unquoted), leading "/" kept
    attrs: tuple  # ((name, value), ...): value True (set), False (unset), None (unspecified), or a string
    base: str  # the folder of its .gitattributes, relative to the root ("" for the root)
    line: int
    regex: re.Pattern | None  # None: matches no file (a folder-only pattern)
    basename_only: bool

    def matches(self, rel: str) -> bool:
        if self.regex is None:
            return False
        if self.base:
            if not rel.startswith(self.base + "/"):
                return False
            rel = rel[len(self.base) + 1 :]
        target = rel.rsplit("/", 1)[-1] if self.basename_only else rel
        return self.regex.fullmatch(target) is not None


def unquote(text: str) -> str | None:
    """A C-style quoted pattern ("a\\tb", "\\303\\251"), as git's unquote_c_style reads it; None if malformed."""
    if not (len(text) >= 2 and text.startswith('"') and text.endswith('"')):
        return None
    out, i, body = bytearray(), 0, text[1:-1]
    escapes = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, '"': 34}
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out += ch.encode("utf-8")
            i += 1
        elif body[i + 1 : i + 2] in escapes:
            out.append(escapes[body[i + 1]])
            i += 2
        elif re.fullmatch(r"[0-3][0-7][0-7]", body[i + 1 : i + 4]):
            out.append(int(body[i + 1 : i + 4], 8))
            i += 4
        else:
            return None
    return out.decode("utf-8", "replace")


def quote(pattern: str) -> str:
    """A pattern written so git reads it back as `pattern`: quoted when it holds a space, tab, quote or control character."""
    if not re.search(r'[\s"\\\x00-\x1f]', pattern) and not pattern.startswith("#"):
        return pattern
    body = pattern.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t").replace("\n", "\\n")
    return '"' + body + '"'


def escape_glob(name: str) -> str:
    """A path written as a pattern that matches exactly that path."""
    return re.sub(r"([*?\[\\])", r"\\\1", name)


def _split_pattern(line: str) -> tuple[str | None, str]:
    if line.startswith('"'):
        match = re.match(r'"(?:[^"\\]|\\.)*"', line)
        if not match:
            return None, ""
        return unquote(match.group(0)), line[match.end() :]
    match = re.match(r"[^ \t\r\n]+", line)
    if match is None:
        return None, ""
    return match.group(0), line[match.end() :]


def _attr_values(tokens: list[str], macros: dict) -> tuple | None:
    out = []
    value: object
    for tok in tokens:
        if tok.startswith("-"):
            name, value = tok[1:], False
        elif tok.startswith("!"):
            name, value = tok[1:], UNSPECIFIED
        elif "=" in tok:
            name, value = tok.split("=", 1)
        else:
            name, value = tok, True
        if not re.fullmatch(r"[A-Za-z0-9_.][-A-Za-z0-9_.]*", name or ""):
            return None  # attr.c: "is not a valid attribute name": the line is skipped
        if value is True and name in macros:
            out.extend(macros[name])
        out.append((name, value))
    return tuple(out)


def parse(text: str, base: str = "", macros: dict | None = None) -> list[Rule]:
    """The rules of one `.gitattributes` file whose folder is `base` (relative to the root)."""
    macros = dict(MACROS) if macros is None else macros
    rules = []
    for number, raw in enumerate(text.splitlines(), 1):
        if len(raw.encode("utf-8", "replace")) > MAX_LINE:
            continue
        line = raw.lstrip(" \t")
        if not line or line.startswith("#"):
            continue
        pattern, rest = _split_pattern(line)
        if not pattern:
            continue
        values = _attr_values(rest.split(), macros)
        if values is None:
            continue
        if pattern.startswith("[attr]"):
            if not base:  # macros are read from the top-level file only
                macros[pattern[len("[attr]") :]] = values
            continue
        if pattern.startswith("!"):
            continue  # git: "Negative patterns are ignored in git attributes"
        rules.append(_rule(pattern, values, base, number))
    return rules


def _rule(pattern: str, values: tuple, base: str, line: int) -> Rule:
    body = pattern
    folder_only = body.endswith("/") and not body.endswith("\\/")
    if folder_only:
        body = body.rstrip("/")
    basename_only = "/" not in body
    if body.startswith("/"):
        body = body[1:]
    regex = None if folder_only or not body else translate(body, pathname=not basename_only)
    return Rule(pattern, values, base, line, regex, basename_only)


def translate(pattern: str, pathname: bool = True) -> re.Pattern | None:
    """wildmatch as a regular expression; `pathname` is WM_PATHNAME (`*` stops at `/`). None: matches nothing."""
    out, i, n = [], 0, len(pattern)
    star = "[^/]*" if pathname else ".*"
    one = "[^/]" if pathname else "."
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            if i + 1 >= n:
                return None  # a trailing backslash: wildmatch gives up (WM_ABORT_ALL)
            out.append(re.escape(pattern[i + 1]))
            i += 2
        elif ch == "*":
            j = i
            while j < n and pattern[j] == "*":
                j += 1
            double = j - i >= 2 and pathname and (i == 0 or pattern[i - 1] == "/") and (j == n or pattern[j] == "/")
            if double and j < n:  # "**/": zero or more folders
                out.append("(?:.*/)?")
                j += 1
            else:
                out.append(".*" if double else star)
            i = j
        elif ch == "?":
            out.append(one)
            i += 1
        elif ch == "[":
            cls, i = _bracket(pattern, i, pathname)
            if cls is None:
                return None
            out.append(cls)
        else:
            out.append(re.escape(ch))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def _bracket(pattern: str, i: int, pathname: bool) -> tuple[str | None, int]:
    """A `[...]` expression at `i`: its regex class and the index after it; None if unterminated."""
    j = i + 1
    negate = j < len(pattern) and pattern[j] in "!^"
    j += negate
    parts: list[str] = []
    first = True
    while j < len(pattern):
        ch = pattern[j]
        if ch == "]" and not first:
            body = "".join(parts) or r"\x00-\U0010ffff"
            if negate:
                return f"[^{body}{'/' if pathname else ''}]", j + 1
            return (f"(?!/)[{body}]" if pathname else f"[{body}]"), j + 1
        first = False
        if ch == "[" and pattern.startswith("[:", j):
            end = pattern.find(":]", j + 2)
            if end < 0:
                return None, j
            name = pattern[j + 2 : end]
            if name not in _CLASSES:
                return None, j  # wildmatch: a malformed class aborts the match
            parts.append(_CLASSES[name])
            j = end + 2
            continue
        if ch == "\\":
            j += 1
            if j >= len(pattern):
                return None, j
            ch = pattern[j]
        if j + 2 < len(pattern) and pattern[j + 1] == "-" and pattern[j + 2] != "]":
            hi = pattern[j + 2]
            if hi == "\\" and j + 3 < len(pattern):
                hi, j = pattern[j + 3], j + 1
            if hi >= ch:
                parts.append(f"{re.escape(ch)}-{re.escape(hi)}")
            j += 3
            continue
        parts.append(re.escape(ch))
        j += 1
    return None, j


class Attributes:
    """The rules of every `.gitattributes` of a folder, in the order git applies them."""

    def __init__(self, files: dict[str, str]):
        """`files` maps each `.gitattributes` path (relative to the root) to its text."""
        macros = dict(MACROS)
        self.rules: list[Rule] = []
        for rel in sorted(files, key=lambda r: (r.count("/"), r)):  # root first: deeper files win
            base = rel.rsplit("/", 1)[0] if "/" in rel else ""
            self.rules += parse(files[rel], base, macros)

    def value(self, rel: str, name: str):
        """The value git gives attribute `name` of file `rel`: True, False, a string, or None (unspecified)."""
        result = UNSPECIFIED
        for rule in self.rules:
            if rule.matches(rel):
                for attr, value in rule.attrs:
                    if attr == name:
                        result = value
        return result

    def rule_for(self, rel: str, name: str) -> Rule | None:
        """The last rule that decides `name` for `rel` (None if no rule names it)."""
        found = None
        for rule in self.rules:
            if rule.matches(rel) and any(attr == name for attr, _ in rule.attrs):
                found = rule
        return found

    def in_lfs(self, rel: str) -> bool:
        """git-lfs stores a file whose `filter` attribute is `lfs`."""
        return self.value(rel, "filter") == "lfs"
