"""raipack's reading of `.gitattributes` (pipeline/core/gitattributes.py, pipeline/core/wildmatch.py)
held to `git check-attr` on seeded, generated cases (issue 37, items 1 and 9).

Each case is a `.gitattributes` (patterns with stars, `**/`, `?`, brackets with ranges, classes
and negation, escapes, leading and trailing `/`, quoting, negative patterns, macros, odd line
ends, BOMs and NUL bytes) and a handful of paths, some drawn to match its patterns. The cases of a
batch live in one repository this test creates (each in its own folder, so under its own nested
`.gitattributes`; the root file defines the macros they use), with hooks off and no configuration
read: one `git check-attr --stdin -z` call answers every path of the batch. raipack must give
every attribute asked the value git gives it. A failure names the seed, the case's bytes and the
path: `pytest tests/test_pipeline/test_gitattributes_vs_git.py -k <seed>` replays it."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raipack.core.gitattributes import Attributes
from raipack.core.wildmatch import Matcher

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed: nothing to compare the reader with")

ATTRS = ["filter", "diff", "merge", "text", "big", "crlf", "x-y"]
ROOT = b"[attr]big filter=lfs diff=lfs -text\n[attr]huge big x-y=1\n[attr]binary -diff\n"
LITERALS = "ab.x-_1"
ATOMS = ["a", "b", ".", "x", "-", "_", "1", "ab", "*", "*", "**", "?", "[ab]", "[a-c]", "[z-a]", "[!a]", "[^a]", "[]a]", "[!]]",
         "[a-]", "[--0]", "[[:digit:]]", "[[:alpha:][:digit:]]", "[[:space:]]", "[[:punct:]]", "[[:bogus:]]", "[[:a]", "[[:]",
         "[\\]]", "[a\\-c]", "[ab", "\\*", "\\?", "\\[", "\\a", "\\", "é", "[é]", "[\x7f-\xff]", " "]
NAME_CHARS = list("abx.1-_*?[]!^:\\ ") + ["é", "\t", "\r", "\v", "\x0c", "ab", "xa", "ba"]
VALUES = ["filter=lfs", "-filter", "!filter", "filter", "binary", "big", "-big", "!big", "huge", "text=auto", "-filter=lfs",
          "!filter=x", "filter=", "diff=lfs filter=x", "fil@ter=lfs", "-", "=x", "filter=lfs -filter", "-filter filter=lfs",
          "crlf", "x-y", "binary filter=lfs", "filter=a=b"]
ENDS = [b"\n"] * 12 + [b"\r\n", b"\r\n", b"\r", b"\v", b"\x0c", b"\x1c", b"\x1d", b"\x1e", "\u2028".encode(), "\x85".encode(), b"\0"]


def _pattern(rng: random.Random) -> str:
    segs = []
    for _ in range(rng.choice([1, 1, 1, 2, 2, 3])):
        segs.append("".join(rng.choice(ATOMS) for _ in range(rng.randint(1, 4))))
    pat = "/".join(segs)
    roll = rng.random()
    if roll < 0.15:
        pat = "/" + pat
    elif roll < 0.2:
        pat = "**/" + pat
    if rng.random() < 0.1:
        pat += "/"
    if rng.random() < 0.06:
        pat = "!" + pat
    if rng.random() < 0.04:
        pat = "\\!" + pat
    return pat


def _quoted(rng: random.Random, pat: str) -> bytes:
    if rng.random() < 0.8 or " " in pat:
        body = pat.replace("\\", "\\\\").replace('"', '\\"').replace(" ", rng.choice([" ", "\\040"]))
        if rng.random() < 0.3:
            body = body.replace("a", "\\141", 1).replace("x", "\\t", 1)
        tail = rng.choice(['"', '"', '"', "", '"b'])  # "" leaves it unterminated: git takes the raw word
        return ('"' + body + tail).encode()
    return pat.encode()


def _line(rng: random.Random) -> bytes:
    pat = _pattern(rng)
    if rng.random() < 0.15 or " " in pat:
        head = _quoted(rng, pat)
    else:
        head = pat.encode()
    lead = rng.choice([b"", b"", b"", b" ", b"\t", b"\r"])
    roll = rng.random()
    if roll < 0.04:
        return lead + b"# " + head + b" filter=lfs"
    if roll < 0.08:
        return b"[attr]" + rng.choice([b"big", b"m1", b"fil@", b"huge"]) + b" " + rng.choice(VALUES).encode()
    if roll < 0.1:
        return b"*" + b"a" * rng.choice([2030, 2040, 2041, 2042, 2043, 2044, 2050]) + b" filter=lfs"
    sep = rng.choice([b" ", b" ", b"\t", b"  ", b"\r"])
    return lead + head + sep + rng.choice(VALUES).encode().replace(b" ", sep) + rng.choice([b"", b"", b" ", b"\r", b"\t"])


def _text(rng: random.Random) -> bytes:
    out = rng.choice([b"", b"", b"", b"\xef\xbb\xbf"])
    for _ in range(rng.randint(1, 5)):
        out += _line(rng) + rng.choice(ENDS)
    return out if rng.random() < 0.8 else out.rstrip(b"\n")


def _instance(rng: random.Random, pat: str) -> str:
    """A path drawn to match `pat` often: stars filled, `?` and brackets given a plausible byte."""
    out, i = [], 0
    pat = pat.lstrip("!/").replace("**/", rng.choice(["", "d/", "d/e/"]))
    while i < len(pat):
        ch = pat[i]
        if ch == "*":
            out.append(rng.choice(["", "a", "xb", "a/b", "ab.x"]))
        elif ch == "?":
            out.append(rng.choice("ab.1/"))
        elif ch == "[":
            j = pat.find("]", i + 2)
            out.append(rng.choice(pat[i + 1 : j] if j > 0 else "[") if rng.random() < 0.8 else rng.choice("az1:]"))
            i = j if j > 0 else i
        elif ch == "\\" and i + 1 < len(pat):
            out.append(pat[i + 1])
            i += 1
        elif ch != "\\":
            out.append(ch)
        i += 1
    path = "/".join(p for p in "".join(out).split("/") if p not in ("", ".", ".."))
    return path or "a"


def _path(rng: random.Random) -> str:
    parts = ["".join(rng.choice(NAME_CHARS) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
    return "/".join(p if p not in (".", "..") else "x" for p in parts)


def _case(rng: random.Random) -> tuple[dict[str, bytes], list[str]]:
    files = {".gitattributes": _text(rng)}
    if rng.random() < 0.15:
        files["d/.gitattributes"] = _text(rng)
    pats = []
    for text in files.values():
        for line in text.split(b"\n"):
            word = line.strip(b" \t\r").split(b" ")[0].decode("utf-8", "replace")
            if word and not word.startswith("#"):
                pats.append(word.strip('"'))
    paths = {_path(rng) for _ in range(4)} | {_instance(rng, rng.choice(pats)) for _ in range(4) if pats}
    paths |= {"d/" + p for p in list(paths)[:2]}
    return files, sorted(p for p in paths if "\0" not in p)


def _git_env(tmp: Path) -> dict:
    return {"PATH": os.environ["PATH"], "HOME": str(tmp), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C"}


def git_check_attr(tmp: Path, cases: list[tuple[dict[str, bytes], list[str]]], attrs: list[str] = ATTRS) -> list[dict]:
    """git's answers for every case in one repository (case k under folder ck/) and one check-attr
    call: per case, {(path, attr): "set" | "unset" | "unspecified" | value}."""
    repo = tmp / "repo"
    shutil.rmtree(repo, ignore_errors=True)
    env = _git_env(tmp)
    subprocess.run(["git", "-c", "core.hooksPath=/dev/null", "init", "-q", str(repo)], check=True, env=env, capture_output=True)
    (repo / ".gitattributes").write_bytes(ROOT)
    asked = []
    for k, (files, paths) in enumerate(cases):
        for rel, data in files.items():
            target = repo / f"c{k}" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        asked += [f"c{k}/{p}" for p in paths]
    stdin = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in asked)
    out = subprocess.run(["git", "-c", "core.hooksPath=/dev/null", "-c", "core.quotePath=false", "check-attr", "--stdin", "-z", *attrs],
                         cwd=repo, env=env, input=stdin, check=True, capture_output=True).stdout
    fields = out.split(b"\0")
    answers: list[dict] = [{} for _ in cases]
    for i in range(0, len(fields) - 2, 3):
        path = fields[i].decode("utf-8", "surrogateescape")
        case, _, rel = path.partition("/")
        answers[int(case[1:])][(rel, fields[i + 1].decode())] = fields[i + 2].decode("utf-8", "surrogateescape")
    return answers


def raipack_answers(files: dict[str, bytes], paths: list[str], names: list[str] = ATTRS) -> dict:
    attrs = Attributes({".gitattributes": ROOT, **{f"c/{rel}": data for rel, data in files.items()}})
    out = {}
    for p in paths:
        for name in names:
            v = attrs.value(f"c/{p}", name)
            out[(p, name)] = "set" if v is True else "unset" if v is False else "unspecified" if v is None else v
    return out


def _compare(tmp: Path, seed: int, count: int) -> int:
    rng = random.Random(seed)
    cases = [_case(rng) for _ in range(count)]
    answers = git_check_attr(tmp, cases)
    checked = 0
    for k, ((files, paths), git) in enumerate(zip(cases, answers)):
        started = time.perf_counter()
        ours = raipack_answers(files, paths)
        assert time.perf_counter() - started < 5, f"seed {seed} case {k}: over 5 s"
        assert len(git) == len(ours), f"seed {seed} case {k}: git answered {len(git)} of {len(ours)}"
        wrong = {key: (ours[key], git[key]) for key in ours if ours[key] != git[key]}
        assert not wrong, f"seed {seed} case {k} {files!r}: (raipack, git) differ: {wrong}"
        checked += len(ours)
    return checked


@needs_git
@pytest.mark.parametrize("seed", [1, 2])
def test_reading_agrees_with_git_check_attr(seed, tmp_path):
    """The quick tier: 2 x 150 generated cases, every path and attribute as git says."""
    assert _compare(tmp_path, seed, 150) > 150 * 8 * len(ATTRS) // 2


@needs_git
@pytest.mark.fuzz
@pytest.mark.parametrize("seed", range(100, 106))
def test_fuzz_reading_agrees_with_git_check_attr(seed, tmp_path):
    """The fuzz tier: 6 x 100 more seeded cases."""
    assert _compare(tmp_path, seed, 100) > 100 * 8 * len(ATTRS) // 2


@needs_git
@pytest.mark.parametrize("text, path, git_says", [
    (b"a\rb filter=lfs\n", "b", "unspecified"),  # "\r" is a blank inside a line: "a" gets "b" and "filter"
    (b"x filter=lfs\x0bb\n", "x", "lfs\x0bb"),  # "\v" is an ordinary byte
    (b"*.bin -diff\x1c*.bin filter=lfs\n", "m.bin", "unspecified"),  # "\x1c" does not end a line
    ("*.bin -diff\u2028*.bin filter=lfs\n".encode(), "m.bin", "unspecified"),
    (b"*.bin filter=lfs\r\n", "m.bin", "lfs"),  # a "\r" before "\n" is dropped
    (b"[z-a]* filter=lfs\n", "m.bin", "unspecified"),  # a reversed range takes nothing
    (b"\xef\xbb\xbf*.bin filter=lfs\n", "m.bin", "lfs"),
    (b"*.bin filter=lfs\0junk\n*.onnx filter=lfs\n", "m.bin", "lfs"),  # a NUL ends its line
    (b"*.bin -filter=lfs\n", "m.bin", "unset"),
    (b'"*.bin filter=lfs\n', '"m.bin', "lfs"),  # unterminated quote: the raw word '"*.bin' is the pattern
    (b"d/a**/b filter=lfs\n", "d/ax/y/b", "lfs"),  # after the literal "d/a", "**" stands at the start (dir.c)
])
def test_line_reading_cases_agree_with_git(text, path, git_says, tmp_path):
    """Named cases of issue 37 item 9: all but the CRLF one differed from git on b938a75 (splitlines() and regexes)."""
    git = git_check_attr(tmp_path, [({".gitattributes": text}, [path])])[0][(path, "filter")]
    assert git == git_says
    assert raipack_answers({".gitattributes": text}, [path])[(path, "filter")] == git_says


def test_backtracking_pattern_is_matched_in_linear_time():
    """Issue 37 item 1: `*a*a*a*a*a*a*a*a*a*a*a*a*b` beside a file named `a` x 60 ran past 60 s on
    b938a75 (a backtracking regex); here each match is far under a second, at 60 and at 4000 bytes."""
    pattern = "*a" * 12 + "*b"
    started = time.perf_counter()
    attrs = Attributes({".gitattributes": f"{pattern} filter=lfs\n"})
    assert not attrs.in_lfs("a" * 60) and attrs.in_lfs("a" * 60 + "b")
    assert not attrs.in_lfs("d/" + "a" * 4000) and attrs.in_lfs("a" * 4000 + "b")
    assert time.perf_counter() - started < 2
    huge = Matcher(("*a" * 1000).encode() + b"*b", pathname=True)
    started = time.perf_counter()
    assert not huge.match(b"a" * 4000)
    assert time.perf_counter() - started < 5


def test_validate_with_backtracking_rule_finishes(make_pkg, tmp_path):
    """The whole command on the issue's package (an AMD 1.8 layout with the rule and the file):
    `raipack validate` in a subprocess with a 20 s limit; it hung past 120 s on b938a75."""
    pkg = make_pkg("1.8.0-npu-16K")
    (pkg / ".gitattributes").write_text("*a*a*a*a*a*a*a*a*a*a*a*a*b filter=lfs\n")
    (pkg / ("a" * 60)).write_bytes(b"x" * 100)
    done = subprocess.run([sys.executable, "-P", "-c", "from raipack.cli import main; main()", "validate", str(pkg), "--format", "json"],
                          capture_output=True, timeout=20, cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path)})
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert b"Traceback" not in done.stderr and json.loads(done.stdout)["results"]


CLASSES = ["alnum", "alpha", "blank", "cntrl", "digit", "graph", "lower", "print", "punct", "space", "upper", "xdigit"]


@needs_git
def test_every_class_and_wildcard_takes_the_bytes_git_takes(tmp_path):
    """Each `[:class:]`, `?`, a negated set and a reversed range against every byte a file name can
    hold (1-255 but "/"): git's ctype (its isspace has no \\v or \\f), not Python's or the C library's."""
    names = [bytes([b]).decode("utf-8", "surrogateescape") for b in range(1, 256) if b not in b"/."]  # git reads "." as the folder
    lines = [f"[[:{name}:]] {name}" for name in CLASSES] + ["d/? filter=any", "d/[!a-y] text=neg", "d/[z-a] diff=reversed"]
    files = {".gitattributes": ("\n".join(lines) + "\n").encode()}
    paths = names + ["d/" + n for n in names]
    asked = [*CLASSES, "filter", "text", "diff"]
    git = git_check_attr(tmp_path, [(files, paths)], asked)[0]
    ours = raipack_answers(files, paths, asked)
    assert sum(v == "set" for v in git.values()) > 500  # the classes take bytes at all
    assert {k: (ours[k], git[k]) for k in git if ours[k] != git[k]} == {}
