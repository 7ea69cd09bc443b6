"""The ONNX graph, read without its weights: parse, domains, external data, contract."""

from __future__ import annotations

from raipack.checks.base import check
from raipack.core import schemas
from raipack.npu import contract as contract
from raipack.npu.external_data import external_data_refs
from raipack.npu.graph import GraphRefused

KNOWN_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.ryzenai", "com.amd", "ai.raipack"}
def _graph(ctx):
    g = ctx.graph
    return None if g is None or isinstance(g, Exception) else g


def _first_line(exc: Exception) -> str:
    lines = str(exc).splitlines()
    return (lines[0][:200] if lines else "") or type(exc).__name__


@check("RP701", "graph-parse")
def graph_parse(ctx):
    """The decoder graph (`model.decoder.filename`, else the only `.onnx`)
    parses as ONNX without loading its weights. A graph keeps its weights in
    external data, so a file above 64 MiB, or with more than 100 000 nodes or
    500 000 protobuf fields (counted before parsing), is refused unparsed.
    Its operator domains are ones a Ryzen AI runtime provides (standard,
    `com.microsoft`, `com.ryzenai`, `com.amd`, raipack's `ai.raipack`); an
    unknown domain is a warning."""
    rel = ctx.graph_rel
    if rel is None:
        if ctx.profile.files.required and ctx.pkg.by_role("graph") == [] and ctx.genai is not None:
            yield ctx.finding("genai_config.json", "names no decoder graph that is in the package", "copy the .onnx file that model.decoder.filename names", "/model/decoder/filename")
        return
    g = ctx.graph
    if isinstance(g, GraphRefused):
        yield ctx.finding(rel, str(g), g.hint)
        return
    if isinstance(g, Exception):
        yield ctx.finding(rel, f"is not a readable ONNX model: {_first_line(g)}", "copy the file again (a truncated or LFS-pointer file is the usual cause)")
        return
    if g is None:
        return
    for op in g.opset_import:
        if op.domain not in KNOWN_DOMAINS:
            yield ctx.finding(rel, f"uses operator domain {op.domain!r}, which no Ryzen AI runtime is known to provide", "check that the package was built for this runtime", op.domain, "warning")


@check("RP702", "external-data")
def external_data(ctx):
    """Every tensor stored as external data (initializers and node attributes,
    inside `If`/`Loop`/`Scan` subgraphs and local functions too) names a
    regular file inside the package, and its offset + length lie inside that
    file (checked with the file's size only; no weights are read)."""
    g = _graph(ctx)
    if g is None:
        return
    for item in external_data_refs(g, ctx.pkg.path(ctx.graph_rel).parent, ctx.pkg.real_root):  # a cache snapshot: its repository folder
        yield ctx.finding(ctx.graph_rel, item.message, item.hint, item.pointer, members=item.members)


@check("RP703", "io-contract")
def io_contract(ctx):
    """The graph's inputs and outputs are the ones genai_config.json declares:
    `input_ids`, `attention_mask`, one `past_key_values.N.key/value` input and
    `present.N.key/value` output per layer, `logits`; element types, the KV
    head count and head size agree."""
    g = _graph(ctx)
    if g is None or not isinstance(ctx.genai, dict) or schemas.errors("genai_config", ctx.genai):
        return  # a mistyped genai_config.json is RP202's finding; the contract needs a well-typed one
    for item in contract.io_contract(g, ctx.genai):
        yield ctx.finding(ctx.graph_rel, item.message, item.hint, item.pointer, members=item.members)


@check("RP704", "matmulnbits-quant")
def matmulnbits_quant(ctx):
    """Every `MatMulNBits` node carries the bits and block size of the Quark
    quantization config (or of the profile when config.json is `{}`), has zero
    points where the scheme is asymmetric, and no layer Quark excluded (such as
    lm_head) was quantized by the exporter."""
    g = _graph(ctx)
    if g is None:
        return
    rules = ctx.profile.quantization
    quant = ctx.quant_config
    if quant is not None and schemas.errors("quantization_config", quant):
        return  # RP202 reports the mistyped config
    for item in contract.matmulnbits_agreement(g, quant, rules):
        yield ctx.finding(ctx.graph_rel, item.message, item.hint, item.pointer, item.severity)
