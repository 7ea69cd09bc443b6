"""raipack's NPU header as the RP9xx checks read it: whether a package must carry raipack's formats
(a raipack header, or a package that says raipack built it), the header read and parsed once per
check context (cached on the context for RP901–RP907, which live in three check modules), and the
small metastate files read through the package scan. The formats themselves are npu/formats.py."""

from __future__ import annotations

import hashlib

from raipack.core.package import JSON_MAX_BYTES, ReadError
from raipack.npu import formats as fmt
from raipack.npu.detect import built_by_raipack
from raipack.npu.target import Target


def _header_rel(ctx) -> str:
    opts, _ = ctx.options
    name = opts.get("external_data_file")
    return name if isinstance(name, str) and name else "model.pb.bin"


def _raipack_claim(ctx) -> str | None:
    """Why this package must have a raipack header (None when nothing says raipack built it)."""

    found = built_by_raipack(ctx.pkg)
    if found is not None:
        return f"manifest.json says raipack built this package for {found.profile.extends or found.profile.id}"
    if ctx.profile.target is Target.REFERENCE:
        return f"it is checked as raipack's reference profile {ctx.profile.id}"
    return None


def reference_header(ctx):
    """(header rel path, parsed header or FormatError) when this is a raipack reference package, else None.

    A package that says raipack built it gets a FormatError for a header without raipack's magic
    (AMD's, damaged, empty): it must carry raipack's formats."""
    cached = getattr(ctx, "_npu_header", None)
    if cached is not None:
        return cached or None
    rel = _header_rel(ctx)
    fe = ctx.pkg.files.get(rel)
    result: bool | tuple[str, dict | fmt.FormatError] = False  # False: looked, not a reference header
    if fe is not None and not fe.lfs:  # a missing or pointer header is RP107 / RP404 / RP102's
        head, data = _read_header_file(ctx, rel, fe.size)
        ctx._npu_magic = head == fmt.MAGIC
        if ctx._npu_magic:
            try:
                fmt.check_header_size(fe.size, rel)
                result = (rel, fmt.decode_header(data, rel))
                ctx._npu_header_sha = hashlib.sha256(data).hexdigest()  # RP904 and RP905 compare it
            except fmt.FormatError as err:
                result = (rel, err)
        elif (why := _raipack_claim(ctx)) is not None:
            result = (rel, fmt.FormatError(
                f"{rel} starts with {head!r}, not raipack's header magic {fmt.MAGIC!r}, but {why}, "
                "and a package raipack built must have raipack's header",
                f"rebuild the package with raipack build, or copy {rel} again from the package raipack wrote"))
    ctx._npu_header = result
    return result or None


def _read_header_file(ctx, rel: str, size: int) -> tuple[bytes, bytes]:
    """(magic-sized head, whole file) of the header, opened once: the whole file only when it starts
    with raipack's magic and is small enough to be a header (an AMD header is never read whole)."""
    try:
        with ctx.pkg.open(rel) as fh:
            head = fh.read(len(fmt.MAGIC))
            if head != fmt.MAGIC or size > fmt.MAX_HEADER_FILE:
                return head, b""
            return head, head + fh.read(fmt.MAX_HEADER_FILE + 1 - len(head))
    except (OSError, ReadError):
        return b"", b""


def small_file(ctx, rel: str) -> bytes:
    """A .state or .const file: the bytes the package scan read, else read once (ReadError when it cannot be)."""
    return ctx.pkg.scanned_bytes(rel, JSON_MAX_BYTES, "metastate file")


def parsed_header(ctx):
    ref = reference_header(ctx)
    if ref is None or not isinstance(ref[1], dict):
        return None, None
    return ref
