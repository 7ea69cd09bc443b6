"""File names and values from a package never reach a terminal or a report raw.

Every reporter (text, json, junit, sarif) and `raipack inspect` escape control
characters (C0, C1, DEL), bidi overrides and bytes that are not UTF-8, and
shorten long values (pipeline/core/textsafe.py); reports written with `-o` and a
strict UTF-8 stdout never raise, and JUnit stays well-formed XML.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from factory import make_package
from helpers import edit_json, ryzen
from raipack.cli import main
from raipack.core.textsafe import LIMIT, safe, safe_tree

ROOT = Path(__file__).resolve().parents[2]
P16 = "1.8.0-npu-16K"
RAW_NAME = b"\xff\xfe.json"  # not UTF-8
ANSI_NAME = "\x1b]0;pwned\x07\x1b[2Jred\x1b[31m\u202egnp.py"  # title, clear screen, colour, right-to-left override
C1_NAME = "nel\x85csi\x9b2J\u2028.py"
LONG_KEY = "hybrid_opt_" + "x" * 20000
# Any character a terminal or an XML parser could act on; "\n" separates lines.
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff\ud800-\udfff]")


@pytest.fixture(scope="module")
def evil_pkg(tmp_path_factory) -> Path:
    """A package with hostile file names, each named in a finding (broken
    JSON, code files), and hostile values."""
    pkg = make_package(tmp_path_factory.mktemp("evil"), P16)
    with open(os.path.join(os.fsencode(pkg), RAW_NAME), "wb") as fh:
        fh.write(b"{")
    (pkg / ANSI_NAME).write_text("x = 1\n")
    (pkg / C1_NAME).write_text("hi\n")
    with open(pkg / "\x1b[5mbig[blink].bin", "wb") as fh:  # among inspect's largest files
        fh.truncate(1 << 22)
    deep: list = []
    node = deep
    for _ in range(900):
        node.append([])
        node = node[0]

    def hostile(doc):
        doc["search"]["max_length"] = deep
        ryzen(doc)[LONG_KEY] = "\x1b[5m" + "v" * 20000
        ryzen(doc)["\x1b[2J[/bold]typo"] = "1"

    edit_json(pkg / "genai_config.json", hostile)
    return pkg


DRIVER = """
import json, sys, traceback
from raipack.cli import main
for args in json.loads(sys.argv[1]):
    print("=== BEGIN", flush=True)
    try:
        main(args)
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        traceback.print_exc()
        code = "traceback"
    sys.stdout.flush()
    sys.stdout.buffer.write(f"=== END {code}\\n".encode())
    sys.stdout.flush()
"""


def run_strict(runs: list[list[str]]) -> list[tuple[int, str]]:
    """The CLI, once per argument list, in one subprocess whose stdout is strict
    UTF-8 and whose locale is C."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict", "LC_ALL": "C", "NO_COLOR": "1"}
    env.pop("LANG", None)
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(runs)], cwd=ROOT, env=env, capture_output=True, timeout=300)
    out = proc.stdout.decode("utf-8")  # strict: raises on anything that is not UTF-8
    parts = re.findall(r"=== BEGIN\n(.*?)=== END (\w+)\n", out, re.S)
    assert len(parts) == len(runs), out[-2000:]
    crashed = [" ".join(args[:-1]) for args, (_, code) in zip(runs, parts) if code == "traceback"]
    assert not crashed and b"Traceback" not in proc.stderr, f"tracebacks in: {crashed}\n" + proc.stderr.decode("utf-8", "replace")[-3000:]
    return [(int(code), text) for text, code in parts]


def assert_safe(text: str) -> None:
    bad = sorted({repr(c) for c in UNSAFE.findall(text)})
    assert not bad, f"unescaped characters reached the output: {bad}"
    assert max(map(len, text.splitlines()), default=0) < 3 * LIMIT, "a long value was printed whole"


def test_every_format_is_safe_on_a_strict_utf8_stdout_and_in_files(evil_pkg, tmp_path):
    pkg = str(evil_pkg)
    files = {fmt: tmp_path / f"report.{fmt}" for fmt in ("text", "json", "junit", "sarif")}
    runs = [["validate", pkg]] + [["validate", "--format", fmt, "-o", str(path), pkg] for fmt, path in files.items()] \
        + [["validate", "--format", fmt, pkg] for fmt in ("json", "junit", "sarif")]
    results = run_strict(runs)
    assert [code for code, _ in results] == [1] * len(runs)  # documented: 1 = error findings (the 900-deep max_length)
    for _, out in results:
        assert_safe(out)
    text = results[0][1]
    assert "\\xff\\xfe.json" in text and "\\x1b]0;pwned\\x07\\x1b[2Jred\\x1b[31m\\u202egnp.py" in text and "nel\\u0085csi\\u009b2J\\u2028.py" in text
    assert results[1][1] == ""  # text -o: the report goes to the file only
    written = {fmt: path.read_bytes().decode("utf-8") for fmt, path in files.items()}  # strict UTF-8
    for body in written.values():
        assert_safe(body)
    assert written["text"].splitlines()[:-1] == text.splitlines()[:-1]  # the last line says how long it took
    assert ET.fromstring(written["junit"].encode()).tag == "testsuites"
    assert "\\xff\\xfe.json" in written["junit"]
    report = json.loads(written["json"])
    paths = {f["path"] for r in report["results"] for f in r["findings"]}
    assert "\\xff\\xfe.json" in paths
    sarif = json.loads(written["sarif"])
    uris = {loc["physicalLocation"]["artifactLocation"]["uri"] for res in sarif["runs"][0]["results"] for loc in res["locations"]}
    assert "%FF%FE.json" in uris  # SARIF locations are URIs: the exact bytes, percent-encoded
    assert sarif["runs"][0]["originalUriBaseIds"]["PKG"]["uri"].startswith("file:///")
    json_out, junit_out, sarif_out = (out for _, out in results[-3:])
    assert json.loads(json_out)["results"][0]["findings"] == report["results"][0]["findings"]
    assert ET.fromstring(junit_out.encode()).tag == "testsuites"
    assert json.loads(sarif_out)["runs"][0]["results"] == sarif["runs"][0]["results"]


def test_inspect_escapes_names_values_and_markup(evil_pkg, capsys):
    with pytest.raises(SystemExit) as info:
        main(["inspect", str(evil_pkg)])
    out, err = capsys.readouterr()
    assert info.value.code == 0, err
    assert_safe(out)
    assert "\\x1b[5mbig[blink].bin" in out and "\\x1b[2J[/bold]typo" in out
    with pytest.raises(SystemExit):
        main(["inspect", "--json", str(evil_pkg)])
    out, _ = capsys.readouterr()
    data = json.loads(out)
    assert "\\x1b[5mbig[blink].bin" in {row["path"] for row in data["files"]["largest"]}
    assert_safe(json.dumps(data, ensure_ascii=False, indent=1))  # the values themselves, decoded


def test_error_messages_are_escaped(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["validate", str(tmp_path / "\x1b[2Jmissing")])
    _, err = capsys.readouterr()
    assert info.value.code == 2 and "\x1b" not in err and "\\x1b[2Jmissing" in err


@pytest.mark.parametrize("value, shown", [
    ("plain name.json", "plain name.json"),
    ("tab\there", "tab\\x09here"),
    ("\x7f\x85\u202e\u2066\ufeff", "\\x7f\\u0085\\u202e\\u2066\\ufeff"),
    (os.fsdecode(b"\xff\xfe.json"), "\\xff\\xfe.json"),  # bytes that are not UTF-8: \xNN with NN >= 80
    ("\U000e0041 tag", "\\U000e0041 tag"),
    ("模型 é", "模型 é"),
])
def test_safe_escapes_what_a_terminal_would_act_on(value, shown):
    assert safe(value) == shown
    safe(value).encode("utf-8")


def test_safe_shortens_long_values_and_deep_trees():
    text = safe("a" * 100_000 + "\x1b" * 10 + "z")
    assert len(text) < LIMIT + 40 and text.startswith("a" * 100) and text.endswith("\\x1bz") and "(100011 characters)" in text
    deep: list = []
    node = deep
    for _ in range(5000):
        node.append([])
        node = node[0]
    shown = safe_tree({"k": deep, "many": list(range(10_000))})
    assert len(json.dumps(shown)) < 2000
