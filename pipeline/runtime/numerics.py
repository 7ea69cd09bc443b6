"""`--numerics float|bfp16`: the reference runtime with the NPU's activation formats.

`float` runs the package as it is (float32 everywhere: an ideal NPU). `bfp16` rewrites the
package's fused functions (domain ai.raipack) in memory, at load time, never in the package's
files: where `pipeline/data/numerics.json` says, a member node's input or output goes through
Quark's `com.amd.quark:BFPQuantizeDequantize` (BFP16: blocks of 8 values along the last axis share
one 8-bit exponent, 7 mantissa bits and a sign each) or through a round trip to bfloat16 (`Cast`
to bfloat16 and back, round to nearest even). Nodes outside the fused functions (embedding, final
norm, lm_head: the CPU side) stay float. The KV cache is rounded to bfloat16 by the runtime after
each call (`round_bfloat16`): the cache buffer is shared between past and present, so no node
of the graph can round it. BFP16 as Quark defines it; the NPU's exact arithmetic is not published.

Quark's operator library comes from Quark's own install, `get_library_path("CPU")` (compiled on
first use into the torch extensions folder). Importing Quark loads it, so where it comes from is
decided before the import (`raipack.core.libraries.check_origins`): no extensions folder chosen by a
relative or empty TORCH_EXTENSIONS_DIR, XDG_CACHE_HOME or HOME (the working directory would decide),
none inside the package, no relative PATH entry or CXX for the compile, no torch, Quark or
onnxruntime found in the package or the working directory; the path Quark returns is checked again.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

from raipack.core.errors import RaipackError, UsageError
from raipack.core.libraries import check_origins
from raipack.data import load_data

MODES = ("float", "bfp16")
HONEST = "BFP16 as Quark defines it; the NPU's exact arithmetic is not published"
FUSED_DOMAIN = "ai.raipack"
BFLOAT16, FLOAT = 16, 1  # onnx.TensorProto element types


def check_mode(numerics: str) -> str:
    """`numerics` itself, or UsageError naming the choices."""
    if numerics not in MODES:
        raise UsageError(f"--numerics is {numerics!r}; expected one of {', '.join(MODES)}", "use --numerics float or --numerics bfp16")
    return numerics


def plan(numerics: str) -> dict:
    """The rewrite table of `numerics` from pipeline/data/numerics.json ({} for float)."""
    return {} if check_mode(numerics) == "float" else load_data("numerics.json")[numerics]


def ready(modes, untrusted: tuple[Path, ...] = ()) -> list[str]:
    """The numerics modes asked for, each checked (UsageError naming the choices) and without
    repeats; when one is not float, amd-quark required (UsageError, exit 2) and the places its
    libraries would come from checked (RaipackError; `untrusted`: the input folders, when known),
    before anything loads. The one check `raipack run`, `raipack bench` and `raipack eval` make."""
    modes = list(dict.fromkeys(check_mode(m) for m in modes))
    if any(m != "float" for m in modes):
        require_quark()
        check_origins(untrusted)
    return modes


def require_quark() -> None:
    """UsageError (exit 2) when amd-quark is not installed (the light install)."""
    if importlib.util.find_spec("quark") is None:
        raise UsageError("--numerics bfp16 needs amd-quark, which raipack's build extra installs",
                         "install raipack[build] (amd-quark 0.13), or run with --numerics float")


def quark_library(untrusted: tuple[Path, ...] = ()) -> Path:
    """The path of Quark's custom-op library (BFPQuantizeDequantize), from Quark's own install.
    Before Quark is imported (the import loads the library), every place it could come from is
    checked (`check_origins`: the package and the other `untrusted` folders, and the working
    directory through relative variables); after it, the path Quark returns is checked again."""
    require_quark()
    check_origins(untrusted)
    try:
        from quark.onnx.operators.custom_ops import get_library_path

        with contextlib.redirect_stdout(sys.stderr):  # Quark's compile messages never reach stdout
            lib = Path(get_library_path("CPU")).resolve()
    except Exception as exc:
        raise RaipackError(f"Quark's custom-op library (BFPQuantizeDequantize) could not be built or found: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                           "check that torch and a C++ compiler are installed (Quark compiles the library on first use), or run with --numerics float") from None
    for folder in untrusted:
        if lib.is_relative_to(Path(folder).resolve()):
            raise RaipackError(f"Quark's custom-op library resolves to {lib}, inside {folder}: raipack never loads a library from a package",
                               "unset TORCH_EXTENSIONS_DIR or point it outside the package, then run again")
    if not lib.is_file():
        raise RaipackError(f"Quark returned {lib} for its custom-op library, which is not a file", "reinstall amd-quark, or run with --numerics float")
    return lib


def rewrite(model, numerics: str):
    """A copy of `model` whose fused functions round activations as `numerics` says; counts of the
    inserted nodes per format. `model` itself is not modified."""
    import onnx

    table = plan(numerics)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    counts = {"bfp16": 0, "bfloat16": 0}
    if not table:
        return out, counts
    kernel = table["kernel"]
    for func in out.functions:
        if func.domain != FUSED_DOMAIN:
            continue
        nodes = []
        for j, node in enumerate(func.node):
            before, after = [], []
            for slot, fmt in table["inputs"].get(node.op_type, {}).items():
                k = int(slot)
                if k < len(node.input) and node.input[k]:
                    rounded = f"{node.input[k]}__{fmt}_in{j}_{k}"
                    before += _round(node.input[k], rounded, fmt, kernel, f"{node.name}/in{k}")
                    node.input[k] = rounded
                    counts[fmt] += 1
            for slot, fmt in table["outputs"].get(node.op_type, {}).items():
                k = int(slot)
                if k < len(node.output) and node.output[k]:
                    raw = f"{node.output[k]}__raw_out{j}_{k}"
                    after += _round(raw, node.output[k], fmt, kernel, f"{node.name}/out{k}")
                    node.output[k] = raw
                    counts[fmt] += 1
            nodes += [*before, node, *after]
        del func.node[:]
        func.node.extend(nodes)
        if counts["bfp16"] and not any(o.domain == kernel["domain"] for o in func.opset_import):
            func.opset_import.append(onnx.helper.make_opsetid(kernel["domain"], 1))
    if counts["bfp16"] and not any(o.domain == kernel["domain"] for o in out.opset_import):
        out.opset_import.append(onnx.helper.make_opsetid(kernel["domain"], 1))
    return out, counts


def _round(src: str, dst: str, fmt: str, kernel: dict, name: str) -> list:
    from onnx import helper

    if fmt == "bfp16":  # the Cast to float gives the op's output a type that the function's type inference sees
        mid = f"{dst}__bfp16"
        return [helper.make_node(kernel["op"], [src], [mid], name=f"{name}/bfp16", domain=kernel["domain"], **kernel["attributes"]),
                helper.make_node("Cast", [mid], [dst], name=f"{name}/bfp16_typed", to=FLOAT)]
    if fmt == "bfloat16":
        mid = f"{dst}__bf16"
        return [helper.make_node("Cast", [src], [mid], name=f"{name}/to_bf16", to=BFLOAT16),
                helper.make_node("Cast", [mid], [dst], name=f"{name}/from_bf16", to=FLOAT)]
    raise ValueError(f"pipeline/data/numerics.json names the format {fmt!r}; expected bfp16 or bfloat16")


def round_bfloat16(a) -> None:
    """Rounds a float32 numpy array to bfloat16 in place (round to nearest even, as onnxruntime's
    Cast and Quark's float2bfloat_cpu do); NaN stays NaN, Inf stays Inf."""
    import numpy as np

    u = a.view(np.uint32)
    nan = np.isnan(a)
    u += np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    u &= np.uint32(0xFFFF0000)
    if nan.any():
        a[nan] = np.nan
