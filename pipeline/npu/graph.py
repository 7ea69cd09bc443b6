"""A package's decoder graph, read without its weights and within the package reader's caps."""

from __future__ import annotations

from raipack.core import onnxproto, protowire
from raipack.core.package import GRAPH_MAX_BYTES, GRAPH_MAX_FIELDS, GRAPH_MAX_NODES, ReadError

WEIGHTS_HINT = "keep the weights in external data (model.onnx.data, the model builder's default), or check that the right file was placed here"


class GraphRefused(Exception):
    """The graph was not parsed; str() is the sentence, `hint` the next step."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.hint = hint


def load_graph(pkg, rel: str | None):
    """The graph `rel` of package `pkg` without its weights, a GraphRefused or parse error, or None
    (no graph, an LFS pointer or an empty file: RP102/RP103 report those)."""
    if rel is None:
        return None
    fe = pkg.files[rel]
    if fe.lfs or fe.size == 0:
        return None
    if fe.size > GRAPH_MAX_BYTES:
        return GraphRefused(f"is {fe.size} bytes, too large to be a graph with external weights (at most {GRAPH_MAX_BYTES} bytes are read)", WEIGHTS_HINT)
    try:
        raw = pkg.read_bytes(rel, GRAPH_MAX_BYTES, "graph with external weights")
        limits = {"onnx.NodeProto": GRAPH_MAX_NODES}
        fits = protowire.fits(len(raw), GRAPH_MAX_FIELDS, limits)  # a small graph cannot pass the caps: no need to count
        counts = protowire.Counts() if fits else protowire.count(raw, onnxproto.ModelProto.DESCRIPTOR, GRAPH_MAX_FIELDS, limits)
        if counts.over == "fields":
            return GraphRefused(f"holds more than {GRAPH_MAX_FIELDS} protobuf fields, too many to be a graph with external weights; it was not parsed", WEIGHTS_HINT)
        if counts.over:
            return GraphRefused(f"has more than {GRAPH_MAX_NODES} nodes (subgraphs and functions included), far more than a decoder has; it was not parsed", "check that the right file was placed here")
        return onnxproto.load_model(raw)
    except ReadError as exc:
        return GraphRefused(str(exc), exc.hint)
    except MemoryError:
        return GraphRefused(f"could not be parsed in the memory available ({fe.size} bytes on disk)", "free memory, or check that the right file was placed here")
    except Exception as exc:  # protobuf raises DecodeError and friends
        return exc
