"""The files an NPU package's runtime opens, checked whether or not raipack built the package.

A package in AMD's own layout has no raipack manifest, so nothing records its files' digests: what the
runtime needs is derived from the profile (its required files and metastate layout), from
`pipeline/data/runtime_files.json` (files the runtime opens by name, with where each is known from) and
from the package's own meta files. Sizes against a meta file's `file_size` are RP603's.
"""

from __future__ import annotations

import fnmatch

from raipack.checks.base import check
from raipack.core.package import ReadError
from raipack.data import load_data
from raipack.npu import amd_header
from raipack.npu.detect import built_by_raipack
from raipack.npu.layout import PREFIX, is_inside, metastate_sets, weights_sibling
from raipack.npu.opened import cache_dir
from raipack.npu.target import Target

COPY = "copy the complete package again (all files of the release)"
HEADER_MAX_BYTES = 16 * 1024 * 1024  # AMD's prefill.pb.bin for a 1.5B model is 7 129 bytes, model_jit.pb.bin for 135M 6 959


def _rules() -> dict:
    return load_data("runtime_files.json")


def _cache_dir(ctx) -> str | None:
    return cache_dir(ctx.genai, ctx.pkg.dirs)


def _opened(ctx) -> list[str]:
    spec = ctx.profile.files
    names = [*spec.required, *spec.recommended, *(p for g in spec.required_one_of for p in g)]
    names += _rules()["opens_as_files"]["patterns"]
    return [n for n in dict.fromkeys(names) if n not in ("cache", ".cache") and not any(c in n for c in "*?[")]


@check("RP111", "runtime-files")
def runtime_files(ctx):
    """Every file the runtime opens is a file (any package). A folder where the runtime opens
    a file (`model.bin`, `tokenizer_config.json`, a `dd_metastate_*` member)
    fails the load: onnxruntime-genai and its tokenizer open these by name,
    and the NPU runtime opens a metastate file it finds instead of compiling
    it again. A release's own extra files are required by name
    (`pipeline/data/runtime_files.json`: `cache/txn_bins.zip` of the 1.7.1 and
    1.8 NPU layouts, which every published 1.8 package carries, the AMD package facts
    §1 [V3]) of a package in AMD's layout (not one raipack built, whose own
    formats name their files: RP901–RP905). Each dd_metastate node of an AMD layout has its
    `cache/<node>_meta.json`, the node's tensor map (AMD's 1.6 NPU packages pair
    `dd_metastate_Llm_Token_MatMulNBits_2_0.*` with
    `.cache/MatMulNBits_2_0_meta.json`, §1 [V]; §6 and AMD's VAIP pass
    `prepare_metadata.cpp` write `tensor_map` with `file_name`/`file_size`).
    A node without the phase set other nodes have is a warning: the runtime
    compiles and writes a missing state at first load, slowly (§6 [V]).
    How far AMD's `model.pb.bin` reaches into `model.bin` is RP112's."""
    for rel in _opened(ctx):
        if rel in ctx.pkg.dirs:
            yield ctx.finding(rel, "is a folder, but the runtime opens it as a file", COPY)
    for d in sorted(ctx.pkg.dirs):
        if d.rsplit("/", 1)[-1].startswith(PREFIX):
            yield ctx.finding(d, "is a folder, but the NPU runtime opens it as a dd_metastate file", COPY)
    if _raipack_layout(ctx):
        return  # raipack's own formats name their files themselves (RP901–RP905)
    cache = _cache_dir(ctx) or "cache"
    for extra in _rules()["extra"]:
        if any(fnmatch.fnmatchcase(ctx.profile.id, p) for p in extra["profiles"]):
            rel = extra["file"].format(cache=cache)
            if rel not in ctx.pkg.files:
                yield ctx.finding(rel, f"is missing: profile {ctx.profile.id} packages carry it ({extra['why'].split(':')[0]})", COPY)
    yield from _node_meta(ctx, cache)


def _raipack_layout(ctx) -> bool:
    """A package raipack built (its manifest says so) or checked as a reference profile: not AMD's layout."""

    return ctx.profile.target is Target.REFERENCE or built_by_raipack(ctx.pkg) is not None


def _node_meta(ctx, cache: str):
    if ctx.profile.metastate.tiered or not ctx.profile.metastate.required:
        return  # raipack's tiered plans name their cache files themselves (RP904, RP905)
    nodes: dict[str, dict[str, str]] = {}
    for stem in metastate_sets(ctx.pkg):
        folder, _, name = stem.rpartition("/")
        for phase in ("Prefill", "Token"):
            if name.startswith(f"{PREFIX}Llm_{phase}_"):
                nodes.setdefault(name[len(f"{PREFIX}Llm_{phase}_"):], {})[phase] = stem
    phases = {p for sets in nodes.values() for p in sets}
    for node, sets in sorted(nodes.items()):
        stem = next(iter(sets.values()))
        rel = f"{cache}/{node}_meta.json"
        if rel not in ctx.pkg.files:
            yield ctx.finding(rel, f"is missing: the metastate set {stem} runs node {node}, whose tensor map the runtime reads from {rel}", COPY)
        for phase in sorted(phases - set(sets)):
            other = stem.replace(f"Llm_{next(iter(sets))}_", f"Llm_{phase}_")
            yield ctx.finding(f"{other}.state", f"is missing: node {node} has no {phase.lower()} metastate set while other nodes have one; "
                              "the runtime compiles a missing state at its first load, slowly (AMD package facts §6)", COPY, severity="warning")


@check("RP112", "amd-npu-weights")
def amd_npu_weights(ctx):
    """AMD's NPU weights header (the file `external_data_file` names:
    `model.pb.bin`, `model_jit.pb.bin`, `prefill.pb.bin`) parses as the
    protobuf message `ryzenai.onnx_utils.proto.Header` the runtime reads
    (fields in `pipeline/data/amd_header.json`), and the weights file it
    names (`external_data.filename`, beside the header: AMD's writer names
    it `<stem>.bin`) is a file in the package (not a folder) and at least as long as the furthest
    weight the header places in it (offset + size of every operator's
    tensors; the size a Git LFS pointer records stands for the real file).
    A header without a weights file name (no JIT weights) asks for none.
    A header over 16 MiB, or holding more than 200 000 fields or 50 000
    messages (AMD's are about 7 KB), is not read: a warning that says so.
    Only for a package in AMD's layout: raipack's own header is RP901's.
    Not checked: what the bytes of `model.bin` hold, the header's shapes
    and data types against the graph, its `layers` and `op_metadata`
    records (read by the runtime's GPU JIT and buffer sizing, not by its
    file reads), whether its strings are UTF-8, and anything in
    `cache/*_meta.json` (they name `.const` files, RP603, not
    `model.bin`)."""
    if _raipack_layout(ctx):
        return
    opts, where = ctx.options
    rel = opts.get("external_data_file")
    fe = ctx.pkg.files.get(rel) if isinstance(rel, str) else None
    if fe is None or fe.lfs:
        return  # RP404 reports a header that is not there, RP102 a pointer in its place
    pointer = where.get("external_data_file", "")
    if fe.size > HEADER_MAX_BYTES:
        yield ctx.finding(rel, f"is {fe.size} bytes, more than the {HEADER_MAX_BYTES} raipack reads of an NPU weights header; its weights were not checked",
                          "check that the right file was placed here", severity="warning")
        return
    try:
        header = amd_header.decode(ctx.pkg.read_bytes(rel, HEADER_MAX_BYTES, "NPU weights header"))
    except ReadError:
        return  # the scan (RP101) reports a file that cannot be read
    except amd_header.HeaderLimit as exc:
        yield ctx.finding(rel, f"{exc}, more than raipack reads of an NPU weights header (at most {amd_header.MAX_FIELDS} fields and "
                          f"{amd_header.MAX_MESSAGES} messages; AMD's hold a few thousand fields in about 7 KB); its weights were not checked",
                          "check that the right file was placed here", severity="warning")
        return
    except amd_header.HeaderError as exc:
        yield ctx.finding(rel, f"does not parse as AMD's NPU weights header (protobuf ryzenai.onnx_utils.proto.Header): {exc}; "
                          f"the runtime's custom operators stop with 'Cannot read header from {rel}' and the model does not load", COPY, pointer)
        return
    name = (header.get("external_data") or {}).get("filename", "")
    if not name:
        return  # no JIT weights: the runtime reads no weights file
    if not is_inside(name):
        yield ctx.finding(rel, f"names weights file {name!r}, a path that leaves the package", COPY, "/external_data/filename")
        return
    folder = rel.rpartition("/")[0]
    wrel = f"{folder}/{name}" if folder else name
    wrel = wrel.replace("\\", "/")
    wfe = ctx.pkg.files.get(wrel)
    if wfe is None:
        if wrel in ctx.pkg.dirs:
            if wrel not in _opened(ctx):  # RP111 reports a folder where the runtime opens a file it knows by name
                yield ctx.finding(rel, f"names weights file {wrel}, which is a folder: the runtime opens it as a file to read the NPU weights", COPY, "/external_data/filename")
        elif wrel != weights_sibling(rel):  # RP404 reports a missing sibling
            yield ctx.finding(rel, f"names weights file {wrel}, which is not in the package: the runtime reads the NPU weights from it", COPY, "/external_data/filename")
        return
    yield from _reach(ctx, rel, wfe, amd_header.weights_extents(header))


def _reach(ctx, rel: str, wfe, extents):
    size = wfe.lfs.size if wfe.lfs else wfe.size
    beyond = sorted((e for e in extents if e.size and e.end > size), key=lambda e: e.end)
    if not beyond:
        return
    last = beyond[-1]
    told = " (its Git LFS pointer's size)" if wfe.lfs else ""
    which = "its one weight" if len(extents) == 1 else f"{len(beyond)} of its {len(extents)} weights"
    furthest = "" if len(beyond) == 1 else ", the furthest"
    yield ctx.finding(wfe.rel, f"is {size} bytes{told}, but {rel} places {which} beyond that{furthest} "
                      f"(node {last.node}, tensor {last.position}) at bytes {last.offset} to {last.end}: the runtime reads past the end of the file "
                      "(on Linux it stops with 'Failed to read'; on Windows the read is not checked and the weights are left unfilled)",
                      COPY)
