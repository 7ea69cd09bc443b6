"""One variant of an ONNX Runtime model package as the flat folder onnxruntime-genai 0.18 loads.

onnxruntime-genai 0.18 recognises a model package (a top-level manifest.json, no genai_config.json)
but refuses to open one: "Model package support requires building onnxruntime-genai against ONNX
Runtime with the OrtModelPackageApi experimental functions" (its wheel is built without them, though
onnxruntime 1.32 has them). So raipack picks the variant for this machine itself and materializes it:
the variant's files and the shared assets its genai_config.json references, under their real names,
as hard links (copies where the file system refuses a link), genai_config.json without its `sha256:`
tokenizer_dir. Nothing from the package runs; only regular files and links are placed.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from raipack.core.errors import UsageError
from raipack.core.output import atomic_write_text, output_folder
from raipack.modelpackage import layout


def available_providers() -> list[str]:
    """The execution providers onnxruntime has here (CPU alone without onnxruntime)."""
    try:
        import onnxruntime
    except ImportError:
        return ["CPUExecutionProvider"]
    return list(onnxruntime.get_available_providers())


def select(root: Path, providers: list[str] | None = None) -> layout.Variant:
    """The variant for this machine: the first (in manifest order) whose execution provider onnxruntime
    has here other than the CPU's, else the first CPU variant."""
    root = Path(root)
    try:
        found = layout.variants(layout.read_manifest(root))
    except (ValueError, KeyError, TypeError, AttributeError, StopIteration) as exc:
        raise UsageError(f"{root / layout.spec()['manifest']} is no model package manifest ({exc})",
                         f"check it with: raipack validate {root}") from None
    have = providers if providers is not None else available_providers()
    for v in found:
        if v.ep in have and v.ep != "CPUExecutionProvider":
            return v
    for v in found:
        if v.ep == "CPUExecutionProvider":
            return v
    raise UsageError(f"{root} has no variant for this machine: its variants need {', '.join(sorted({v.ep for v in found}))}, "
                     f"onnxruntime here has {', '.join(have)}", "add a CPU variant (raipack batch assembles the export as one)")


def place(src: Path, dst: Path) -> bool:
    """Put `src` at `dst`: a link as a link, a regular file as a hard link (a copy across file systems);
    False for anything else (a FIFO, a device), which is left out."""
    st = os.lstat(src)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(src), dst)
    elif stat.S_ISREG(st.st_mode):
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError:
            shutil.copyfile(src, dst, follow_symlinks=False)
    else:
        return False
    return True


def view(root: Path, variant: layout.Variant, dest: Path) -> dict[str, str]:
    """Fill the empty folder `dest` with the variant as a flat folder; return where each placed file
    came from (its path relative to the package root), and "" for what was left out."""
    root, dest = Path(root), Path(dest)
    vdir = root / variant.directory
    origin: dict[str, str] = {}
    try:
        doc = layout.load_json(vdir / "genai_config.json")
    except ValueError:
        doc = None  # the variant's own checks say why
    if not layout.inside(root, vdir):
        raise ValueError(f"the folder {variant.directory} of variant {variant.name} is missing, a link, or outside the package")
    tokenizer = split_tokenizer(doc)
    asset = layout.asset_path(root, doc["model"]["tokenizer_dir"]) if tokenizer is not None else None
    if asset is not None:
        for src in layout.files_of(asset):
            rel = src.relative_to(asset).as_posix()
            origin[rel] = src.relative_to(root).as_posix() if place(src, dest / rel) else ""
    for src in layout.files_of(vdir):
        rel = src.relative_to(vdir).as_posix()
        if rel in origin or (tokenizer is not None and rel == "genai_config.json"):
            continue
        origin[rel] = f"{variant.directory}/{rel}" if place(src, dest / rel) else ""
    if tokenizer is not None:
        atomic_write_text(dest / "genai_config.json", layout.genai_text(layout.without_tokenizer_reference(doc)))
        origin["genai_config.json"] = f"{variant.directory}/genai_config.json"
    return origin


def split_tokenizer(doc) -> tuple[str, str] | None:
    """(digest, tail) of genai_config.json's model.tokenizer_dir when it is a `sha256:` reference."""
    model = doc.get("model") if isinstance(doc, dict) else None
    return layout.split_reference(model.get("tokenizer_dir")) if isinstance(model, dict) else None


def materialize(root: Path, dest: Path, variant: str | None = None) -> tuple[layout.Variant, Path]:
    """(the variant, `dest`): the variant named, else the one for this machine, as a flat folder in the
    new or empty folder `dest` that onnxruntime-genai loads (og.Model(str(dest)))."""
    root = Path(root)
    if variant is None:
        chosen = select(root)
    else:
        found = layout.variants(layout.read_manifest(root))
        named = [v for v in found if v.name == variant]
        if not named:
            raise UsageError(f"{root} has no variant named {variant!r}", f"its variants: {', '.join(v.name for v in found)}")
        chosen = named[0]
    with output_folder(dest) as out:
        try:
            view(root, chosen, out)
        except ValueError as exc:
            raise UsageError(f"{root}: {exc}", f"check it with: raipack validate {root}") from None
    return chosen, Path(dest)
