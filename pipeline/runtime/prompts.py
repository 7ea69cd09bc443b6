"""The benchmark prompts: AMD's packages ship `prompts.txt`, one prompt per line, and raipack's do too.

A prompt of N tokens is the held-out text raipack ships (pipeline/data/heldout.txt, on one line,
repeated as often as needed) cut to N tokens by the package's own tokenizer (`tokenizer.json`, read
by the `tokenizers` library: no code from the package), without special tokens. The fuse stage
writes them at build time (`write_prompts_file`), so a sealed package is never edited afterwards;
`raipack bench` reads them back (`prompt_ids`), cut to exactly N tokens again.
"""

from __future__ import annotations

from pathlib import Path

from raipack.core.errors import RaipackError
from raipack.data import heldout_text, load_data
from raipack.runtime.trust import first_line

MAX_LINE_BYTES = 1 << 20  # a prompt line longer than this is not read


def defaults() -> dict:
    return load_data("bench.json")


class Tokens:
    """encode/decode with a package's tokenizer.json, special tokens left out."""

    def __init__(self, tokenizer_json: Path):
        from tokenizers import Tokenizer

        try:
            self.tok = Tokenizer.from_file(str(tokenizer_json))
        except Exception as exc:  # tokenizers raises Exception for a broken file
            raise RaipackError(f"{tokenizer_json} cannot be read as a tokenizer ({first_line(exc)})", "copy the package's tokenizer files again, or rebuild the package") from None

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


def heldout_ids(tokens: Tokens, length: int) -> list[int]:
    """`length` token ids of the held-out text, repeated as often as needed."""
    text = " ".join(heldout_text().split())
    ids = tokens.encode(text)
    if not ids:
        raise RaipackError("the package's tokenizer turns the held-out text into no tokens", "rebuild the package with a working tokenizer.json")
    reps = -(-length // len(ids))
    return (tokens.encode(" ".join([text] * reps)) if reps > 1 else ids)[:length]


def prompt_lines(tokens: Tokens, lengths: list[int]) -> list[str]:
    """One line per length: the held-out text cut to that many tokens, newline-free."""
    return [" ".join(tokens.decode(heldout_ids(tokens, n)).split()) for n in lengths]


def write_prompts_file(folder: Path, lengths: list[int]) -> int | None:
    """Writes folder/prompts.txt (its bytes), or None when the folder has no tokenizer.json."""
    if not (folder / "tokenizer.json").is_file() or not lengths:
        return None
    text = "\n".join(prompt_lines(Tokens(folder / "tokenizer.json"), sorted(lengths, reverse=True))) + "\n"
    (folder / defaults()["prompts_file"]).write_text(text, "utf-8")
    return len(text.encode())


def read_lines(path: Path) -> list[str]:
    """The non-empty lines of a prompts file, refused in one sentence when it is not UTF-8 text."""
    if path.stat().st_size > 64 * MAX_LINE_BYTES:
        raise RaipackError(f"{path} is {path.stat().st_size} bytes; a prompts file of at most {64 * MAX_LINE_BYTES} bytes is expected", "rebuild the package")
    try:
        return [line for line in path.read_text("utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError as exc:
        raise RaipackError(f"{path} is not UTF-8 text (byte {exc.start})", "rebuild the package, or delete prompts.txt from a copy of it") from None


def prompt_ids(tokens: Tokens, lines: list[str], length: int) -> tuple[list[int], str]:
    """(exactly `length` token ids, where they came from): the shortest line of the package's
    prompts.txt that has at least `length` tokens, cut to it; else the held-out text."""
    encoded = sorted((ids for ids in (tokens.encode(line) for line in lines) if len(ids) >= length), key=len)
    if encoded:
        return encoded[0][:length], "prompts.txt"
    return heldout_ids(tokens, length), "heldout"
