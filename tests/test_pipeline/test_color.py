"""Colour in the text reports (pipeline/core/output.py use_color): on a terminal by default; NO_COLOR set and
not empty turns it off (no-color.org), FORCE_COLOR set and not empty turns it on when the output is not a
terminal (force-color.org, issue 40); with both set, NO_COLOR wins (docs/validating.md says so)."""

import io

import pytest

from helpers import run_cli
from raipack.core.output import use_color

ESC = "\x1b["


class Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize(("no_color", "force_color", "tty", "expected"), [
    (None, None, True, True),
    (None, None, False, False),
    ("1", None, True, False),
    ("", None, True, True),  # empty: as if unset (no-color.org)
    (None, "1", False, True),
    (None, "0", False, True),  # any value but the empty string (force-color.org)
    (None, "", False, False),
    ("1", "1", True, False),  # both: NO_COLOR wins
    ("1", "1", False, False),
])
def test_use_color(monkeypatch, no_color, force_color, tty, expected):
    for name, value in (("NO_COLOR", no_color), ("FORCE_COLOR", force_color)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert use_color(Tty() if tty else io.StringIO()) is expected


def test_force_color_colours_validate_into_a_pipe(make_pkg, capsys, monkeypatch):
    pkg = make_pkg("1.8.0-npu-16K")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    assert ESC not in run_cli(capsys, "validate", pkg).out
    monkeypatch.setenv("FORCE_COLOR", "1")
    coloured = run_cli(capsys, "validate", pkg)
    assert coloured.code == 0 and ESC in coloured.out
    monkeypatch.setenv("NO_COLOR", "1")
    assert ESC not in run_cli(capsys, "validate", pkg).out
