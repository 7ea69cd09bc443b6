"""git's wildmatch (wildmatch.c) in time linear in the text: the pattern compiled once into tokens,
the text run through them as a set of positions (a bit mask), never by backtracking.

git's own wildmatch backtracks, bounded by its "abort" rules; a backtracking regular expression is
not bounded (`*a*a*a*a*a*a*a*a*a*a*a*a*b` against sixty `a`s ran for minutes, issue 37). Every
token between two stars takes exactly one byte, so git's aborts only cut searches that cannot
succeed, and the language git matches is the one these tokens describe:

- `?` any byte, `[...]` a set of bytes (ranges, `[:class:]` as git's ctype has them, `!`/`^`
  negation, `\\` escapes), anything else (or `\\x`) itself; with WM_PATHNAME none of them is `/`;
- `*` any run of bytes (with WM_PATHNAME, of bytes other than `/`); `**` is `*` except with
  WM_PATHNAME when it is the whole of a path segment: at the pattern's start or after `/`, and
  at its end or before `/` (or `\\/`): then any run of bytes, and `**/` also matches nothing;
- a trailing `\\`, an unterminated `[`, or an unknown `[:class:]` match nothing (git aborts).

Matching costs O(len(text) x len(tokens) / 64) machine-word operations: ~1 µs a byte for a
2 KiB pattern (attr.c ignores longer lines)."""

from __future__ import annotations

SLASH, BACKSLASH, STAR, QUESTION, OPEN, CLOSE = b"/\\*?[]"
SPECIAL = frozenset(b"*?[\\")  # git's is_glob_special

# git-compat-util.h's ctype (ASCII only; git's isspace has no \v or \f), libc's C locale for blank and graph
_CLASSES = {
    b"alnum": b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
    b"alpha": b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
    b"blank": b" \t",
    b"cntrl": bytes(range(32)) + b"\x7f",
    b"digit": b"0123456789",
    b"graph": bytes(range(0x21, 0x7F)),
    b"lower": b"abcdefghijklmnopqrstuvwxyz",
    b"print": bytes(range(0x20, 0x7F)),
    b"punct": bytes(c for c in range(0x21, 0x7F) if not chr(c).isalnum()),
    b"space": b"\t\n\r ",
    b"upper": b"ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    b"xdigit": b"0123456789ABCDEFabcdef",
}
_ALL = frozenset(range(1, 256))  # a path holds no NUL byte
_ONE = [frozenset((b,)) for b in range(256)]
_NONE: frozenset = frozenset()
_ANY_BUT_SLASH = _ALL - {SLASH}
_BRACKETS: dict[bytes, frozenset] = {}  # a bracket's source -> its set, shared by every pattern (bounded below)


class Matcher:
    """One pattern, compiled for `match(text)`; `pathname` is git's WM_PATHNAME."""

    def __init__(self, pattern: bytes, pathname: bool):
        self.pathname = pathname
        self.sets: list[frozenset | None] = []  # per token: the bytes it takes, or None for a star
        self.loose: list[bool] = []  # per star: it takes "/" too
        self._eps: list[int] = []  # stars and gates: position i also stands at i + 1 (a star may take nothing)
        self._jump: list[int] = []  # gates, before the star of each "**/": i also stands at i + 3 (no folder at all, "/" included)
        self._compile(pattern)
        self.size = len(self.sets)
        self.eps, self.jump = _mask(self._eps, self.size), _mask(self._jump, self.size)
        self.least = len(self.sets) - len(self._eps) - len(self._jump)  # bytes a match takes at least (not stars, gates, the "/" a gate skips)
        groups: dict[int, tuple[frozenset, list[int]]] = {}  # tokens with the same set (by identity: shared sets)
        stars: dict[bool, list[int]] = {True: [], False: []}
        star = 0
        for k, taken in enumerate(self.sets):
            if taken is None:
                stars[self.loose[star]].append(k)
                star += 1
            elif taken:
                groups.setdefault(id(taken), (taken, []))[1].append(k)
        self._groups = [(taken, _mask(ks, self.size)) for taken, ks in groups.values()]
        self._loose, self._strict = _mask(stars[True], self.size), _mask(stars[False], self.size)
        self._steps: dict[int, tuple[int, int]] = {}

    def _add_star(self, loose: bool, skip: bool) -> None:
        if skip:  # git tries "no folder" once, where the star starts (dowild(p + 1, text)), not after it took bytes
            self._eps.append(len(self.sets))
            self._jump.append(len(self.sets))
            self.sets.append(_NONE)
        self._eps.append(len(self.sets))
        self.sets.append(None)
        self.loose.append(loose)

    def _compile(self, p: bytes) -> None:
        i, n = 0, len(p)
        while i < n:
            ch = p[i]
            if ch == BACKSLASH:
                if i + 1 == n:
                    self.sets.append(_NONE)  # git: the NUL after it never equals a byte of the text
                    return
                self.sets.append(_ONE[p[i + 1]])
                i += 2
            elif ch == QUESTION:
                self.sets.append(_ANY_BUT_SLASH if self.pathname else _ALL)
                i += 1
            elif ch == STAR:
                j = i + 1
                while j < n and p[j] == STAR:
                    j += 1
                if j - i == 1:  # the common case first
                    self._eps.append(len(self.sets))
                    self.sets.append(None)
                    self.loose.append(not self.pathname)
                    i = j
                    continue
                loose, skip = not self.pathname, False
                if self.pathname and (i == 0 or p[i - 1] == SLASH) and (
                        j == n or p[j] == SLASH or p[j : j + 2] == b"\\/"):
                    loose, skip = True, j < n and p[j] == SLASH
                    if skip and self._jump and self._jump[-1] == len(self.sets) - 3 and self.sets[-1] == {SLASH}:
                        i = j + 1  # "**/**/" matches what "**/" matches: one group keeps the closure short
                        continue
                self._add_star(loose, skip)
                i = j
            elif ch == OPEN:
                taken, end = _bracket(p, i)
                if taken is None:
                    self.sets.append(_NONE)  # git: WM_ABORT_ALL, no match
                    return
                key = bytes([self.pathname]) + p[i:end]
                if key not in _BRACKETS:
                    if len(_BRACKETS) > 4096:
                        _BRACKETS.clear()
                    _BRACKETS[key] = taken - {SLASH} if self.pathname else taken
                self.sets.append(_BRACKETS[key])
                i = end
            else:
                self.sets.append(_ONE[ch])
                i += 1

    def _step(self, byte: int) -> tuple[int, int]:
        """(tokens that take `byte` and move on, stars that take `byte` and stay)."""
        got = self._steps.get(byte)
        if got is None:
            move = 0
            for taken, mask in self._groups:
                if byte in taken:
                    move |= mask
            got = self._steps[byte] = (move, self._loose | (self._strict if byte != SLASH else 0))
        return got

    def _close(self, state: int) -> int:
        while True:
            wider = state | ((state & self.eps) << 1) | ((state & self.jump) << 3)
            if wider == state:
                return state
            state = wider

    def match(self, text: bytes) -> bool:
        if len(text) < self.least:
            return False
        state = self._close(1)
        for byte in text:
            move, stay = self._step(byte)
            state = self._close(((state & move) << 1) | (state & stay))
            if not state:
                return False
        return bool(state >> self.size & 1)


def _mask(positions: list[int], size: int) -> int:
    bits = bytearray(size // 8 + 1)
    for k in positions:
        bits[k >> 3] |= 1 << (k & 7)
    return int.from_bytes(bits, "little")


def _bracket(p: bytes, i: int) -> tuple[frozenset | None, int]:
    """The bytes `[...]` at `i` takes, and the index after it (None: git aborts the match). Follows
    wildmatch.c's loop: a `]` first is literal, `a-z` with z < a takes nothing, `[:x` without `:]` is a `[`."""
    n = len(p)

    def at(k: int) -> int:
        return p[k] if k < n else 0

    j = i + 1
    ch = at(j)
    negated = ch in b"!^"
    if negated:
        j += 1
        ch = at(j)
    taken: set[int] = set()
    prev = 0
    while True:
        if not ch:
            return None, n
        if ch == BACKSLASH:
            j += 1
            ch = at(j)
            if not ch:
                return None, n
            taken.add(ch)
        elif ch == ord("-") and prev and at(j + 1) and at(j + 1) != CLOSE:
            j += 1
            ch = at(j)
            if ch == BACKSLASH:
                j += 1
                ch = at(j)
                if not ch:
                    return None, n
            taken.update(range(prev, ch + 1))
            ch = 0
        elif ch == OPEN and at(j + 1) == ord(":"):
            named, k = _class(p, j + 2)
            if named is None:
                return None, n
            if k < 0:
                taken.add(OPEN)  # no ":]": the "[" is an ordinary member
            else:
                taken.update(named)
                ch, j = 0, k
        else:
            taken.add(ch)
        prev = ch
        j += 1
        ch = at(j)
        if ch == CLOSE:
            break
    result = frozenset(taken) & _ALL
    return (_ALL - result if negated else result), j + 1


def _class(p: bytes, start: int) -> tuple[bytes | None, int]:
    """A `[:name:]` whose name starts at `start`: (its members, the index of its "]"); (b"", -1) when
    the first "]" has no ":" before it (then the "[" is a member); (None, -1) when git aborts."""
    k = p.find(b"]", start)
    if k < 0:
        return None, -1
    if k - start - 1 < 0 or p[k - 1] != ord(":"):
        return b"", -1
    return _CLASSES.get(p[start : k - 1]), k


def literal_length(pattern: bytes) -> int:
    """dir.c simple_length: the bytes before the first wildcard."""
    for k, ch in enumerate(pattern):
        if ch in SPECIAL:
            return k
    return len(pattern)
