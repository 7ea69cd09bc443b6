"""Git LFS and the Hugging Face Hub: which files of a folder git-lfs stores, which the Hub would
refuse, and the `.gitattributes` raipack writes (facts and their sources: pipeline/data/hub.json)."""

from __future__ import annotations

from dataclasses import dataclass

from raipack.core.gitattributes import MAX_BYTES, Attributes, escape_glob, quote
from raipack.core.output import atomic_write_text
from raipack.core.package import ReadError
from raipack.data import load_data

NAME = ".gitattributes"


def facts() -> dict:
    return load_data("hub.json")


def limit() -> int:
    return facts()["plain_file_limit_bytes"]


def rule_line(pattern: str) -> str:
    return f"{quote(pattern)} {facts()['lfs_attributes']}"


def kind_patterns() -> list[str]:
    """The Hub's default LFS patterns, then the binary kinds of AMD's package folders."""
    return facts()["hub_default_patterns"] + facts()["amd_patterns"]


READ_MAX_BYTES = 1024 * 1024  # AMD's files are under 2 KiB; git itself reads up to 100 MiB (MAX_BYTES)


def attributes_of(pkg) -> Attributes:
    """The `.gitattributes` files of a scanned package, read as git reads them (one larger than git
    reads counts as empty, as in git). One over READ_MAX_BYTES is refused (ReadError): raipack does not
    match every file against millions of rules."""
    texts: dict[str, bytes] = {}
    for rel, fe in pkg.files.items():
        if fe.name != NAME or fe.symlink or fe.size > MAX_BYTES:
            continue
        if fe.size > READ_MAX_BYTES:
            raise ReadError(f"is {fe.size} bytes, more than the {READ_MAX_BYTES} bytes raipack reads of a {NAME}; its rules were not read",
                            f"keep one line per pattern: {NAME} files of Hub repositories are a few KiB")
        texts[rel] = pkg.read_bytes(rel, READ_MAX_BYTES, "attributes file")  # bytes: git reads them undecoded
    return Attributes(texts)


@dataclass(frozen=True)
class PlannedFile:
    path: str
    size: int
    lfs: bool
    refused: str = ""  # why the Hub would refuse the file ("" when it takes it)


def binary_limit() -> int:
    return facts()["plain_binary_limit_bytes"]


BINARY_PROBE = 8000


def is_binary(pkg, rel: str) -> bool:
    """git's test (xdiff's buffer_is_binary): a NUL byte in the first 8000 bytes."""
    try:
        with pkg.open(rel) as fh:
            return b"\0" in fh.read(BINARY_PROBE)
    except (OSError, ReadError):
        return False


def plan(sizes: dict[str, int], attrs: Attributes, binary=lambda rel: False) -> list[PlannedFile]:
    """Each file as the Hub would receive it: in LFS or not, and refused or not (`binary(rel)` says
    whether a file outside LFS over the Hub's binary limit is binary)."""
    out = []
    for rel in sorted(sizes):
        size, in_lfs = sizes[rel], attrs.in_lfs(rel)
        refused = ""
        if not in_lfs and size > limit():
            refused = f"over the Hub's {limit() // 2**20} MiB limit for files outside Git LFS"
        elif not in_lfs and size > binary_limit() and binary(rel):
            refused = f"a binary file over the Hub's {binary_limit() / 10**6:g} MB limit for binary files outside Git LFS"
        elif in_lfs and size > facts()["lfs_file_limit_bytes"]:
            refused = f"over the Hub's {facts()['lfs_file_limit_bytes'] / 2**30:g} GiB limit per file, even in LFS"
        out.append(PlannedFile(rel, size, in_lfs, refused))
    return out


def suggested_rule(rel: str) -> str:
    """The line that puts `rel` into LFS: its kind's pattern when it has one, else its own path (as the Hub writes it)."""
    name = rel.rsplit("/", 1)[-1]
    for pattern in kind_patterns():
        if "/" not in pattern and Attributes({NAME: rule_line(pattern)}).in_lfs(name):
            return rule_line(pattern)
    return rule_line(escape_glob(rel))


def render(sizes: dict[str, int]) -> str:
    """The `.gitattributes` of a package raipack writes: every kind AMD's folders keep in LFS, and
    each other file over the Hub's limit by its own path."""
    lines = ["# Git LFS rules for the Hugging Face Hub, written by raipack: the Hub's default kinds, the",
             f"# binary kinds of AMD's Ryzen AI packages, and every other file over the Hub's {limit() // 2**20} MiB limit."]
    lines += [rule_line(p) for p in kind_patterns()]
    attrs = Attributes({NAME: "\n".join(lines)})
    lines += [rule_line(escape_glob(rel)) for rel in sorted(sizes) if sizes[rel] > limit() and not attrs.in_lfs(rel)]
    return "\n".join(lines) + "\n"


def sizes_of(folder) -> dict[str, int]:
    """Every regular file under `folder` (its `.git` aside) and its size, by posix path."""
    import os
    from pathlib import Path

    folder, out = Path(folder), {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not (d == ".git" and Path(dirpath) == folder))
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                out[path.relative_to(folder).as_posix()] = path.stat().st_size
    return out


def write(folder) -> str:
    """Write the `.gitattributes` of a package folder raipack made (atomically) and return its text."""
    from pathlib import Path


    text = render(sizes_of(folder))
    atomic_write_text(Path(folder) / NAME, text)
    return text
