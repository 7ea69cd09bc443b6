"""The ONNX Runtime model package format (docs/model_package.md): its manifest, its variants, its
content-addressed shared assets and the `sha256:` references to them. Standard library only, so the
light install reads it; nothing here writes into a package."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from raipack.core.hashing import sha256_many
from raipack.core.jsonread import loads_strict
from raipack.core.package import JSON_MAX_BYTES, JsonError
from raipack.data import load_data

MAX_MANIFEST_BYTES = 1 << 20
HEX = re.compile(r"^[0-9a-f]{64}$")


@lru_cache(maxsize=1)
def spec() -> dict:
    """pipeline/data/ort_model_package.json: the names the format fixes and raipack's mapping onto it."""
    return load_data("ort_model_package.json")


@dataclass(frozen=True)
class Variant:
    name: str
    directory: str  # relative to the package root
    ep: str
    device: str | None
    compatibility_string: str | None


def looks_like_package(path: Path) -> bool:
    """What onnxruntime-genai takes for a model package: a top-level manifest.json and no top-level
    genai_config.json (cheap: two stats)."""
    path = Path(path)
    return (path / spec()["manifest"]).is_file() and not (path / "genai_config.json").exists()


def load_json(path: Path, limit: int = JSON_MAX_BYTES):
    """A JSON file of the package: a regular file (no link followed) of at most `limit` bytes; ValueError
    with one sentence otherwise."""
    path = Path(path)
    try:
        st = os.stat(path, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path.name} is not a regular file")
        if st.st_size > limit:
            raise ValueError(f"{path.name} is {st.st_size} bytes, over the {limit} raipack reads")
        return loads_strict(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise ValueError(f"{path.name} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path.name} is not JSON: {exc}") from None
    except JsonError as exc:
        raise ValueError(f"{path.name} {exc}") from None


def read_manifest(root: Path) -> dict:
    """The package's manifest.json; ValueError with one sentence when it cannot be read as JSON."""
    return load_json(Path(root) / spec()["manifest"], MAX_MANIFEST_BYTES)


def variants(doc: dict) -> list[Variant]:
    """The variants of the package's one component, in manifest order (a schema-valid manifest)."""
    component = next(iter(doc["components"].values()))
    return [Variant(name, v.get("variant_directory", name), v["ep"], v.get("device"), v.get("compatibility_string"))
            for name, v in component["variants"].items()]


def asset_folder(uri_or_hex: str) -> str:
    """`shared_assets/sha256-<hex>` for `sha256:<hex>` or `<hex>`."""
    hex_ = uri_or_hex.removeprefix(spec()["reference_scheme"])
    return f"{spec()['shared_assets']}/{spec()['asset_prefix']}{hex_}"


def inside(root: Path, path: Path) -> bool:
    """`path` is a real folder inside the package `root`, reached through no link."""
    real_root, real = os.path.realpath(root), os.path.realpath(path)
    return real != real_root and os.path.commonpath([real_root, real]) == real_root and real == os.path.abspath(path) and os.path.isdir(real)


def asset_path(root: Path, value: str) -> Path | None:
    """The folder a `sha256:<hex>[/tail]` reference names inside the package, or None when it names none."""
    parts = split_reference(value)
    if parts is None or not HEX.match(parts[0]) or ".." in Path(parts[1]).parts or Path(parts[1]).is_absolute():
        return None
    path = Path(root) / asset_folder(parts[0]) / parts[1]
    return path if inside(root, path) else None


def split_reference(value: str) -> tuple[str, str] | None:
    """(hex digest, tail) of a `sha256:<hex>[/tail]` reference, or None when `value` is no such reference."""
    scheme = spec()["reference_scheme"]
    if not isinstance(value, str) or not value.startswith(scheme):
        return None
    hex_, _, tail = value[len(scheme):].partition("/")
    return hex_, tail


def references(doc, pointer: str = "") -> list[tuple[str, str]]:
    """(JSON pointer, value) of every `sha256:` string in a genai_config.json document, in document order
    (walked without recursion: a document nested hundreds deep was a RecursionError, issue 24)."""
    out, todo = [], [(pointer, doc)]
    while todo:
        where, node = todo.pop()
        if isinstance(node, dict):
            todo += reversed([(f"{where}/{str(k).replace('~', '~0').replace('/', '~1')}", v) for k, v in node.items()])
        elif isinstance(node, list):
            todo += reversed([(f"{where}/{i}", v) for i, v in enumerate(node)])
        elif split_reference(node) is not None:
            out.append((where, node))
    return out


def files_of(folder: Path) -> list[Path]:
    """Every entry below `folder` that is not a directory (symlinks not followed), sorted."""
    out = []
    for top, dirs, names in os.walk(folder, followlinks=False):
        out += [Path(top) / n for n in names]
        out += [Path(top) / d for d in dirs if os.path.islink(os.path.join(top, d))]
    return sorted(out, key=lambda p: p.relative_to(folder).as_posix())


def directory_digest(folder: Path) -> str:
    """The shared-asset digest of a folder, as ONNX Runtime computes it (ModelPackage.compute_directory_hash):
    the sha256 of the lines "<file sha256>  <relative posix path>\\n", sorted by path, over its regular files."""
    folder = Path(folder)
    paths = [p for p in files_of(folder) if p.is_file() and not p.is_symlink()]
    digests = sha256_many(paths)
    lines = []
    for p in paths:
        if isinstance(digests[p], OSError):
            raise digests[p]
        lines.append(f"{digests[p]}  {p.relative_to(folder).as_posix()}\n")
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()


def genai_text(doc: dict) -> str:
    """How raipack writes a variant's genai_config.json: one format, so that removing the tokenizer
    reference gives back, byte for byte, the file the variant's raipack manifest records."""
    return json.dumps(doc, indent=4) + "\n"


def without_tokenizer_reference(doc: dict) -> dict:
    """The genai_config.json of a variant as a flat folder has it: tokenizer files beside it."""
    model = dict(doc.get("model") or {})
    model.pop("tokenizer_dir", None)
    return {**doc, "model": model}
