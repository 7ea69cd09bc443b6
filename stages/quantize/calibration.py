"""Calibration data for the quantize stage.

A small offline English corpus ships with raipack (``pipeline/data/calib.txt``, original prose
written for this project; the held-out set for perplexity is beside it, see raipack.data).
Users may pass their own ``.txt`` (plain text) or ``.jsonl`` (one ``{"text": ...}`` object
per line) file.

Samples are cut from one token stream (documents joined by the EOS token) into
non-overlapping windows of ``seq_len`` tokens; ``num_samples`` windows are taken evenly
spread over the corpus, so a few samples still cover many topics.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raipack.core.errors import RaipackError
from raipack.data import CALIBRATION_TEXT

DEFAULT_CALIBRATION = CALIBRATION_TEXT  # what quantize calibrates with unless a recipe names a file
SUPPORTED_SUFFIXES = (".txt", ".jsonl")


HINT = "fix the recipe's [quantize] options or the input model"


def _line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def read_texts(path: Path) -> list[str]:
    """The documents of a ``.txt`` (paragraphs, blank-line separated) or ``.jsonl`` file."""
    path = Path(path)
    if path.suffix not in SUPPORTED_SUFFIXES:
        raise RaipackError(
            f"{path}: unsupported calibration file type '{path.suffix}'; expected .txt or .jsonl", HINT
        )
    text = _read_utf8(path)
    if not text.strip():
        raise RaipackError(f"{path}: calibration file is empty", HINT)
    if path.suffix == ".txt":
        return _txt_docs(text)
    return _jsonl_docs(path, text)


def _read_utf8(path: Path) -> str:
    """The file's text; a missing, unreadable or non-UTF-8 file is a RaipackError naming the place."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RaipackError(f"{path}: calibration file not found", HINT) from None
    except OSError as exc:
        raise RaipackError(f"{path}: cannot read calibration file: {exc.strerror or exc}", HINT) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RaipackError(
            f"{path}:{_line_of(data, exc.start)}: not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})", HINT
        ) from None
    return text


def _txt_docs(text: str) -> list[str]:
    """Paragraphs: runs of non-blank lines, right-stripped, separated by blank lines."""
    docs, current = [], []
    for line in text.splitlines():
        if line.strip():
            current.append(line.rstrip())
        elif current:
            docs.append("\n".join(current))
            current = []
    if current:
        docs.append("\n".join(current))
    return docs


def _jsonl_docs(path: Path, text: str) -> list[str]:
    """The non-empty "text" field of every non-blank JSON line; at least one."""
    docs = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RaipackError(f"{path}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno})", HINT) from None
        if not isinstance(obj, dict) or "text" not in obj:
            raise RaipackError(f'{path}:{lineno}: expected an object with a "text" field, got {line[:60]!r}', HINT)
        if not isinstance(obj["text"], str):
            raise RaipackError(
                f'{path}:{lineno}: "text" must be a string, got {type(obj["text"]).__name__}', HINT
            )
        if obj["text"].strip():
            docs.append(obj["text"])
    if not docs:
        raise RaipackError(f'{path}: no line has a non-empty "text" field', HINT)
    return docs


def tokenize_texts(
    texts: Sequence[str], tokenizer: Any, num_samples: int, seq_len: int, *, source: str = "calibration texts"
) -> list[Any]:
    """``num_samples`` int64 tensors of shape ``[1, seq_len]`` cut from ``texts``."""
    import torch

    if num_samples < 1 or seq_len < 1:
        raise RaipackError(f"{source}: num_samples and seq_len must be >= 1, got {num_samples} and {seq_len}", HINT)
    docs = [t for t in texts if isinstance(t, str) and t.strip()]
    if not docs:
        raise RaipackError(f"{source}: no non-empty text to calibrate with", HINT)
    sep = getattr(tokenizer, "eos_token_id", None)
    stream: list[int] = []
    for doc in docs:
        ids = tokenizer(doc, add_special_tokens=False)["input_ids"]
        stream.extend(ids)
        if sep is not None:
            stream.append(int(sep))
    windows = len(stream) // seq_len
    if windows < num_samples:
        raise RaipackError(
            f"{source}: {len(stream)} tokens give {windows} windows of {seq_len} tokens, "
            f"{num_samples} samples were asked for; use fewer or shorter samples or a larger file", HINT
        )
    # evenly spread windows over the corpus
    picks = [(i * windows) // num_samples for i in range(num_samples)]
    return [
        torch.tensor(stream[w * seq_len : (w + 1) * seq_len], dtype=torch.long).unsqueeze(0) for w in picks
    ]
