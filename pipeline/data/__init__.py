"""Data files shipped with raipack (file roles, known provider options, ...), and the English
texts two stages share: the calibration corpus (quantize) and the held-out text perplexity is
measured on (quantize's quality record, export's parity), original prose written for raipack."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path

CALIBRATION_TEXT = Path(__file__).resolve().with_name("calib.txt")
HELDOUT_TEXT = Path(__file__).resolve().with_name("heldout.txt")  # never used for calibration


@lru_cache(maxsize=None)
def load_data(name: str, package: str = "raipack.data"):
    """Parse a JSON data file shipped inside `package`."""
    return json.loads(resources.files(package).joinpath(name).read_text("utf-8"))


def heldout_text() -> str:
    """The held-out paragraphs perplexity is measured on."""
    return HELDOUT_TEXT.read_text(encoding="utf-8")
