"""Every file and folder the package's own configs tell a loader to open is in the package."""

from __future__ import annotations

from raipack.checks.base import check
from raipack.npu.external_data import external_data_refs
from raipack.npu.genai import table
from raipack.npu.graph import load_graph
from raipack.npu.opened import nearest_folder, opened

GENAI = "genai_config.json"


@check("RP109", "loader-files")
def loader_files(ctx):
    """Every graph a model section of `genai_config.json` names (`decoder`, `vision`, `embedding`,
    `speech`, `encoder`, each stage of a `pipeline`), every processor config and adapter it names,
    and every RyzenAI option that names a folder (`dd_cache`, `dd_root`) is in the package, where the
    loader looks: relative to the package's folder. The graphs besides the decoder (RP702 checks its
    own) have their external data in the package too. A folder option naming a missing folder while
    the folder it must mean is elsewhere in the package gets that path in its hint. This, not a
    profile's file list, decides which missing file is an error (RP107 warns of the rest). A vision
    section without the `config_filename` its image processor reads is a warning."""
    yield from _processor_config(ctx)
    for item in opened(ctx.genai):
        if item.kind == "file":
            continue  # external_data_file: RP404 (the header and its weights)
        if item.rel.startswith("/") or ":" in item.rel[:3]:
            yield ctx.finding(GENAI, f"{item.pointer} names {item.rel!r}, an absolute path: the package does not carry it wherever it is copied",
                              "name it relative to the package folder", item.pointer, severity="warning")
            continue
        if item.rel.startswith("../") or item.rel == "..":
            continue  # RP104 reports paths leaving the package
        if item.kind == "folder":
            yield from _folder(ctx, item)
        elif item.rel in ctx.pkg.dirs:
            yield ctx.finding(item.rel, f"is a folder, where {item.pointer} of {GENAI} names a {item.kind}", "put the file there", item.pointer)
        elif item.rel not in ctx.pkg.files:
            yield ctx.finding(item.rel, f"is missing: {GENAI} names it at {item.pointer}, and {item.evidence}",
                              "copy the complete package again, or correct the name in genai_config.json", item.pointer)
        elif item.kind == "graph" and item.rel != ctx.graph_rel:
            yield from _external_data(ctx, item.rel)


def _folder(ctx, item):
    if item.rel in ctx.pkg.dirs or item.rel == ".":
        return
    near = nearest_folder(item.rel, ctx.pkg.dirs)
    if item.rel in ctx.pkg.files:
        yield ctx.finding(item.rel, f"is a file, where {item.pointer} of {GENAI} names a folder", "name the folder it means", item.pointer)
    elif near:
        yield ctx.finding(GENAI, f"{item.pointer} names the folder {item.rel!r}, which the package does not have; {item.evidence}",
                          f"the package has {near}/: set {item.pointer.rsplit('/', 1)[-1]} to {near!r}", item.pointer)
    else:
        yield ctx.finding(GENAI, f"{item.pointer} names the folder {item.rel!r}, which the package does not have; {item.evidence}",
                          "copy the folder into the package, or correct the option", item.pointer)


def _external_data(ctx, rel: str):
    g = load_graph(ctx.pkg, rel)
    if g is None or not hasattr(g, "graph"):
        return  # an unreadable graph: RP701 reports the decoder's; the others are read here only for their data
    for item in external_data_refs(g, ctx.pkg.path(rel).parent, ctx.pkg.real_root):
        yield ctx.finding(rel, item.message, item.hint, item.pointer, members=item.members)


def _processor_config(ctx):
    """A vision section's image processor reads model.vision.config_filename (gemma, phi, qwen2.5-vl,
    mistral3 and videochat processors at v0.14.0); without it the processor opens the package folder
    itself. A warning: not every vision model type of every version has been read."""
    vision = table(table(ctx.genai, "model"), "vision")
    if vision.get("filename") and not vision.get("config_filename"):
        yield ctx.finding(GENAI, "model.vision names a vision graph but no config_filename: onnxruntime-genai's image processors read "
                                 "their settings from that file", "set model.vision.config_filename to the package's processor config "
                                 "(processor_config.json)", "/model/vision", severity="warning")
