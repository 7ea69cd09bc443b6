"""Which attributes git gives a path, from the `.gitattributes` files of a folder, without running git.

Written after git's own rules (gitattributes(5), gitignore(5) "PATTERN FORMAT", and the code that
applies them: attr.c, dir.c `match_basename`/`match_pathname`, wildmatch.c) and held to
`git check-attr` on generated cases (tests/test_pipeline/test_gitattributes_vs_git.py), because
whether the Hub stores a file in LFS is whatever git computes for its `filter` attribute. The file
is read as bytes, as git reads it:

- lines end at `\n` only (a `\r` before it is dropped; `\v`, `\f`, U+2028 and the like are
  ordinary bytes); a UTF-8 BOM opens the first line is skipped; a NUL byte ends its line; a line
  of 2048 bytes or more is ignored (attr.c `ATTR_MAX_LINE_LENGTH`);
- a line is `pattern attr...`, split at spaces, tabs and `\r`; blank lines and lines starting
  with `#` are skipped; a pattern starting with `"` is a C-style quoted string (malformed
  quoting: the pattern is the raw word, quote included, as git takes it);
- `attr` sets, `-attr` unsets, `!attr` makes unspecified (a `=value` after `-`/`!` is ignored),
  `attr=value` gives a value; an invalid name drops the whole line; `[attr]name ...` defines a
  macro (top-level file only; the last definition counts); `binary` is git's built-in macro for
  `-diff -merge -text`; a macro that ends up set sets its attributes where it is met;
- a pattern starting with `!` is refused by git ("Negative patterns are ignored"): skipped here too;
- a pattern with no `/` (one trailing `/` aside) matches the file name at any depth; any other is
  anchored to the folder of its `.gitattributes` (a leading `/` only anchors); a pattern with a
  trailing `/` matches only folders, and a folder's attributes are not inherited by the files in
  it, so such a pattern gives a file nothing;
- matching is git's wildmatch on bytes (pipeline/core/wildmatch.py, linear in the path: no
  backtracking), after git's literal-prefix shortcut (whose cut decides, as in git, whether a
  `**` stands at the pattern's start); case-sensitive (the Hub's git is);
- rules are applied as git applies them: from the last line of the deepest file up, the first
  rule to give an attribute a value decides it (within a line, the last mention).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from raipack.core.wildmatch import Matcher, literal_length

MAX_LINE = 2048  # attr.c ATTR_MAX_LINE_LENGTH: a line this long or longer is ignored
MAX_BYTES = 100 * 1024 * 1024  # attr.c ATTR_MAX_FILE_SIZE: a larger file is ignored by git
MACROS = {"binary": (("diff", False), ("merge", False), ("text", False))}
UNSPECIFIED = None
BLANK = b" \t\r\n"  # attr.c `blank`
BOM = b"\xef\xbb\xbf"
MACRO_PREFIX = b"[attr]"
_NAME = re.compile(rb"[A-Za-z0-9_.][-A-Za-z0-9_.]*\Z")  # attr.c attr_name_valid
_ESCAPES = {ord("a"): 7, ord("b"): 8, ord("f"): 12, ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("v"): 11, ord("\\"): 92, ord('"'): 34}


def _bytes(text: str | bytes) -> bytes:
    return text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class Rule:
    pattern: str  # as git reads it (unquoted), leading "/" kept
    attrs: tuple  # ((name, value), ...): value True (set), False (unset), None (unspecified), or a string
    base: str  # the folder of its .gitattributes, relative to the root ("" for the root)
    line: int
    raw: bytes = b""  # the pattern's bytes, one trailing "/" removed
    folder_only: bool = False  # a trailing "/": matches folders only, so no file
    basename_only: bool = False  # no "/": matches the file name at any depth
    literal: int = 0  # the bytes of `raw` before its first wildcard (dir.c nowildcardlen)
    suffix: bool = False  # "*" then no wildcard: the name ends with the rest (dir.c PATTERN_FLAG_ENDSWITH)
    _wild: dict = field(default_factory=dict, compare=False, repr=False)

    def matches(self, rel: str | bytes) -> bool:
        if self.folder_only:
            return False
        path = _bytes(rel)
        if self.base:
            base = _bytes(self.base)
            if not path.startswith(base + b"/"):
                return False
            path = path[len(base) + 1 :]
        if self.basename_only:  # dir.c match_basename
            name = path.rsplit(b"/", 1)[-1]
            if self.literal == len(self.raw):
                return name == self.raw
            if self.suffix:
                return name.endswith(self.raw[1:])
            return self._matcher(self.raw, False).match(name)
        pattern = self.raw[1:] if self.raw.startswith(b"/") else self.raw  # dir.c match_pathname
        prefix = self.literal - (len(self.raw) - len(pattern))
        if prefix:
            if prefix > len(path) or path[:prefix] != pattern[:prefix]:
                return False
            pattern, path = pattern[prefix:], path[prefix:]
            if not pattern and not path:
                return True
        return self._matcher(pattern, True).match(path)

    def _matcher(self, pattern: bytes, pathname: bool) -> Matcher:
        got = self._wild.get(pathname)
        if got is None:
            got = self._wild[pathname] = Matcher(pattern, pathname)
        return got


def unquote(text: str) -> str | None:
    """A C-style quoted pattern ("a\\tb", "\\303\\251"), as git's unquote_c_style reads it; None if malformed."""
    raw = _bytes(text)
    got = _unquote(raw)
    if got is None or got[1] != len(raw):
        return None
    return got[0].decode("utf-8", "surrogateescape")


def _unquote(raw: bytes) -> tuple[bytes, int] | None:
    """quote.c unquote_c_style on `raw` (starting with '"'): the bytes and the index after the closing quote."""
    out, i, n = bytearray(), 1, len(raw)
    while i < n:
        ch = raw[i]
        if ch == ord('"'):
            return bytes(out), i + 1
        if ch != ord("\\"):
            out.append(ch)
            i += 1
            continue
        esc = raw[i + 1] if i + 1 < n else 0
        if esc in _ESCAPES:
            out.append(_ESCAPES[esc])
            i += 2
        elif re.fullmatch(rb"[0-3][0-7][0-7]", raw[i + 1 : i + 4]):
            out.append(int(raw[i + 1 : i + 4], 8) & 0xFF)
            i += 4
        else:
            return None
    return None


def quote(pattern: str) -> str:
    """A pattern written so git reads it back as `pattern`: quoted when it holds a space, tab, quote or control character."""
    if not re.search(r'[\s"\\\x00-\x1f]', pattern) and not pattern.startswith("#"):
        return pattern
    body = pattern.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return '"' + body + '"'


def escape_glob(name: str) -> str:
    """A path written as a pattern that matches exactly that path."""
    return re.sub(r"([*?\[\\])", r"\\\1", name)


def _lines(data: bytes):
    """(number, line) as attr.c reads a file with strbuf_getline: split at "\n", a "\r" before it
    dropped, the BOM of the first line dropped; C strings, so a NUL ends the line."""
    pieces = data.split(b"\n")
    if pieces and pieces[-1] == b"":
        pieces.pop()
    for number, line in enumerate(pieces, 1):
        if line.endswith(b"\r"):
            line = line[:-1]
        if number == 1 and line.startswith(BOM):
            line = line[len(BOM) :]
        yield number, line.split(b"\0", 1)[0]


_RUNS = {True: re.compile(rb"[ \t\r\n]*"), False: re.compile(rb"[^ \t\r\n]*")}


def _span(line: bytes, pos: int, inside: bool) -> int:
    """strspn (inside) or strcspn (not inside) of BLANK from `pos`."""
    run = _RUNS[inside].match(line, pos)
    return run.end() if run else pos  # always a match: both patterns take zero bytes


def _attr_values(states: bytes) -> tuple | None:
    """attr.c parse_attr over the states of a line; None when a name is invalid (git skips the line)."""
    out = []
    pos = _span(states, 0, True)
    while pos < len(states):
        end = _span(states, pos, False)
        word = states[pos:end]
        name, eq, value = word.partition(b"=")
        setto: object
        if word[:1] in (b"-", b"!"):
            name, setto = name[1:], (False if word[:1] == b"-" else UNSPECIFIED)
        else:
            setto = value.decode("utf-8", "surrogateescape") if eq else True
        if not _NAME.match(name):
            return None
        out.append((name.decode("ascii"), setto))
        pos = _span(states, end, True)
    return tuple(out)


def parse(text: str | bytes, base: str = "", macros: dict | None = None) -> list[Rule]:
    """The rules of one `.gitattributes` file whose folder is `base` (relative to the root); the
    macros it defines go into `macros` (top-level file only)."""
    macros = dict(MACROS) if macros is None else macros
    rules = []
    for number, line in _lines(_bytes(text)):
        start = _span(line, 0, True)
        if start == len(line) or line[start] == ord("#") or len(line) >= MAX_LINE:
            continue
        quoted = _unquote(line[start:]) if line[start] == ord('"') else None
        if quoted is not None:
            pattern, states = quoted[0], line[start + quoted[1] :]
        else:
            end = _span(line, start, False)
            pattern, states = line[start:end], line[end:]
        pattern = pattern.split(b"\0", 1)[0]  # a C string from here on
        if len(pattern) > len(MACRO_PREFIX) and pattern.startswith(MACRO_PREFIX):
            name = pattern[len(MACRO_PREFIX) :]
            name = name[: _span(name, _span(name, 0, True), False)].lstrip(BLANK)
            values = _attr_values(states)
            if base or not _NAME.match(name) or values is None:
                continue  # a macro is defined in the top-level file only ("not allowed" elsewhere)
            macros[name.decode("ascii")] = values
            continue
        values = _attr_values(states)
        if values is None or pattern.startswith(b"!"):
            continue  # an invalid name; git: "Negative patterns are ignored in git attributes"
        rules.append(_rule(pattern, values, base, number))
    return rules


def _rule(pattern: bytes, values: tuple, base: str, line: int) -> Rule:
    folder_only = pattern.endswith(b"/")  # dir.c parse_path_pattern: one "/" is removed
    raw = pattern[:-1] if folder_only else pattern
    suffix = raw[:1] == b"*" and literal_length(raw[1:]) == len(raw) - 1
    return Rule(pattern.decode("utf-8", "replace"), values, base, line, raw, folder_only, b"/" not in raw, literal_length(raw), suffix)


class Attributes:
    """The rules of every `.gitattributes` of a folder, in the order git applies them."""

    def __init__(self, files: Mapping[str, str | bytes]):
        """`files` maps each `.gitattributes` path (relative to the root) to its text (bytes as read, or str)."""
        self.macros = dict(MACROS)
        self.rules: list[Rule] = []
        for rel in sorted(files, key=lambda r: (r.count("/"), r)):  # root first: deeper files win
            base = rel.rsplit("/", 1)[0] if "/" in rel else ""
            self.rules += parse(files[rel], base, self.macros)

    def _decide(self, rel: str, name: str) -> tuple[object, Rule | None]:
        """attr.c fill: rules from the last up; each rule's attributes from the last; the first value
        an attribute gets stands; a macro set there sets its own attributes then (recursively)."""
        known: dict[str, object] = {}
        for rule in reversed(self.rules):
            if not rule.matches(rel):
                continue
            todo = [iter(reversed(rule.attrs))]
            while todo:
                for attr, value in todo[-1]:
                    if attr in known:
                        continue
                    known[attr] = value
                    if attr == name:
                        return value, rule
                    if value is True and attr in self.macros:
                        todo.append(iter(reversed(self.macros[attr])))
                        break
                else:
                    todo.pop()
        return UNSPECIFIED, None

    def value(self, rel: str, name: str):
        """The value git gives attribute `name` of file `rel`: True, False, a string, or None (unspecified)."""
        return self._decide(rel, name)[0]

    def rule_for(self, rel: str, name: str) -> Rule | None:
        """The rule that decides `name` for `rel` (None if no rule names it)."""
        return self._decide(rel, name)[1]

    def in_lfs(self, rel: str) -> bool:
        """git-lfs stores a file whose `filter` attribute is `lfs`."""
        return self.value(rel, "filter") == "lfs"
