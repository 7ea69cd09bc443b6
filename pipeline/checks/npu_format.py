"""raipack reference packages: the open NPU formats (model.pb.bin + model.bin, cache descriptors,
dd_metastate plans) agree with each other, with the graph and with the provider options.

The checks run on a package whose NPU header starts with raipack's magic (`RAIPKNPU`) and on every
package that says raipack built it (a reference profile, detected from manifest.json or chosen),
where a header without the magic, or one that does not parse, is an RP901 error that says why
RP902–RP907 could not run. AMD's packages use AMD's own undocumented formats, so elsewhere these
checks are no-ops. They read the header, the graph without weights, the cache meta/descriptor
files and the plans (small files); only RP902 reads model.bin, and only with --verify-hashes. The
formats are documented in docs/formats.md and implemented in pipeline/npu/formats.py (standard
library only at import time).

This module holds RP901–RP902 (the header and its weights file); npu_fused.py holds RP903–RP904
(the fused graph and its cache files), npu_plans.py RP905–RP907 (the metastate plans, the tier
options and the CPU fallback). The header they share is read once through npu/reference.py.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor

from raipack.checks.base import check
from raipack.npu import formats as fmt
from raipack.npu.layout import weights_sibling
from raipack.npu.reference import parsed_header, reference_header


@check("RP901", "npu-header")
def npu_header(ctx):
    """A raipack `model.pb.bin` parses (magic, version, length, the sha256 of
    its JSON document) and agrees with its weights file (`model.bin`): the
    recorded size, every tensor's offset (aligned to the header's alignment,
    4096), its size (dtype × shape), inside the file, no two tensors
    overlapping. Reads the header only. raipack writes a package's
    `manifest.json` last, so a reference header without one is an
    unfinished or altered package. A package that says raipack built it
    (its manifest, or a reference profile) must have such a header: one
    without the magic, truncated, of another version or with a broken
    JSON document is an error, as RP902–RP907 cannot check it."""
    ref = reference_header(ctx)
    if ref is None:
        return
    rel, doc = ref
    if "manifest.json" not in ctx.pkg.files and ctx._npu_magic:  # without the magic, RP107 reports it
        yield ctx.finding("manifest.json", f"is missing, but {rel} is a raipack reference header: raipack writes the manifest last, so this package is unfinished or was altered",
                          "rebuild the package with raipack build, or copy it again with its manifest.json")
    if isinstance(doc, fmt.FormatError):
        yield ctx.finding(rel, f"{doc}; RP902–RP907 read this header, so they could not check the package",
                          doc.hint or "rebuild the package with raipack build", doc.pointer)
        return
    wrel = doc.get("weights_file", weights_sibling(rel))
    if wrel != weights_sibling(rel):
        yield ctx.finding(rel, f"names weights file {wrel!r}, but the runtime reads the sibling {weights_sibling(rel)!r}", "rebuild the package", "/weights_file")
    fe = ctx.pkg.files.get(wrel)
    if fe is None or fe.lfs:
        return  # RP404 / RP102 report a missing or pointer weights file
    for pointer, message in fmt.header_problems(doc, fe.size):
        yield ctx.finding(rel, message, "rebuild the package; model.bin and model.pb.bin must come from the same build", pointer)


@check("RP902", "npu-weights-hash", needs="verify_hashes")
def npu_weights_hash(ctx):
    """With `--verify-hashes`: every tensor of a raipack `model.bin` hashes to
    the sha256 that `model.pb.bin` records for it (a flipped byte, or a
    weights file from another build, is caught)."""
    rel, doc = parsed_header(ctx)
    if doc is None:
        return
    wrel = doc.get("weights_file", weights_sibling(rel))
    fe = ctx.pkg.files.get(wrel)
    if fe is None or fe.lfs or fmt.header_problems(doc, fe.size):
        return  # RP901 says why the offsets cannot be trusted
    tensors = {t["name"]: t for _, _, _, t in fmt.header_tensors(doc)}
    path = ctx.pkg.path(wrel)

    def digest(t):
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            fh.seek(t["offset"])
            left = t["size"]
            while left:
                block = fh.read(min(left, 8 << 20))
                if not block:
                    break
                h.update(block)
                left -= len(block)
        return t["name"], h.hexdigest()

    with ThreadPoolExecutor(max_workers=max(1, ctx.jobs or 2)) as pool:
        results = dict(pool.map(digest, tensors.values()))
    bad = [n for n, h in results.items() if h != tensors[n]["sha256"]]
    for name in bad[:20]:
        t = tensors[name]
        yield ctx.finding(wrel, f"tensor {name} (bytes {t['offset']}..{t['offset'] + t['size']}) does not hash to the sha256 {rel} records", "the weights file is corrupt or from another build; copy or rebuild it", name)
    if len(bad) > 20:
        yield ctx.finding(wrel, f"{len(bad) - 20} more tensors do not match their sha256", "rebuild the package")
