"""Reporters format validation results; they never decide anything."""

from __future__ import annotations

from typing import Callable

from raipack.reporters import junit, sarif, text
from raipack.reporters.json_report import render as render_json

REPORTERS: dict[str, Callable] = {
    "text": text.render,
    "json": render_json,
    "junit": junit.render,
    "sarif": sarif.render,
}
