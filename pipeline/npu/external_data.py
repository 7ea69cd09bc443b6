"""Where an ONNX graph keeps its tensors outside itself: every external-data reference (subgraphs
and local functions included) must point inside the package at a byte range of a regular file that
exists. Read without the weights: `os.stat` only. Used by the graph checks of validate
(pipeline/checks/graph.py) and the export stage's output checks (stages/export/contract.py); the
graph's I/O contract is in pipeline/npu/contract.py."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path, PurePosixPath

from raipack.core.findings import Finding
from raipack.core.members import grouped
from raipack.core.onnxproto import ModelProto, TensorProto, tensor_nbytes
from raipack.npu.contract import GRAPH, type_name


def _finding(pointer: str, message: str, hint: str) -> Finding:
    """An external-data finding: `pointer` names the tensor at fault; the caller places it in its package."""
    return Finding("export.external_data", "error", GRAPH, message, hint, pointer)


def _external_tensors(model: ModelProto):
    """(tensor, where) for every tensor the model holds: initializers, sparse
    initializers and node attribute tensors of the main graph, of every subgraph
    (`If`/`Loop`/`Scan` attributes, at any depth) and of the local functions.
    `where` names the subgraph or function ("" for the main graph)."""
    todo = [(model.graph.node, model.graph, "")] + [(f.node, None, f"function '{f.name}'") for f in model.functions]
    while todo:
        nodes, graph, where = todo.pop()
        if graph is not None:
            yield from ((t, where) for t in graph.initializer)
            yield from ((t, where) for s in graph.sparse_initializer for t in (s.values, s.indices))
        for node in nodes:
            for a in node.attribute:  # every field, whatever `type` claims: a reader may go by the field
                inner = f"subgraph {a.name} of node '{node.name}'" + (f" in {where}" if where else "")
                tensors = ([a.t] if a.HasField("t") else []) + list(a.tensors)
                sparse = ([a.sparse_tensor] if a.HasField("sparse_tensor") else []) + list(a.sparse_tensors)
                yield from ((t, where) for t in tensors + [x for s in sparse for x in (s.values, s.indices)])
                todo.extend((g.node, g, inner) for g in ([a.g] if a.HasField("g") else []) + list(a.graphs))


def external_data_refs(model: ModelProto, base_dir: str | Path, root: str | Path | None = None) -> list[Finding]:
    """Every external-data tensor (subgraphs included) points inside `root`
    (default: `base_dir`, the graph's folder) at a byte range of a regular file
    that exists (stat only)."""
    out: list[Finding] = []
    graph_dir = Path(base_dir).resolve()
    base = Path(root).resolve() if root is not None else graph_dir
    sizes: dict[str, int | str] = {}
    resolved: dict[str, Path] = {}  # one resolve (a stat per path component) per location, not per tensor
    pending: dict[tuple[str, str], list[Finding]] = {}
    for t, where in _external_tensors(model):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        name = f"tensor '{t.name}'" + (f" (in {where})" if where else "")
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        if not loc:
            out.append(_finding(t.name, f"{name} is stored externally but names no location",
                          "re-export; the builder writes location=model.onnx.data"))
            continue
        p = PurePosixPath(loc.replace("\\", "/"))
        if p.is_absolute() or re.match(r"^[A-Za-z]:", loc) or ".." in p.parts:
            out.append(_finding(t.name,
                          f"{name} points at '{loc}', outside the model folder; expected a relative path inside it",
                          "re-save the model with its external data beside model.onnx"))
            continue
        if loc not in resolved:  # realpath: a symlink loop is a path that is no file (reported below), not a RuntimeError
            resolved[loc] = Path(os.path.realpath(graph_dir / Path(*p.parts)))
        path = resolved[loc]
        if base != path and base not in path.parents:
            out.append(_finding(t.name,
                          f"{name} points at '{loc}', which resolves outside the model folder",
                          "replace the symlink by the real file"))
            continue
        if loc not in sizes:
            sizes[loc] = _data_file_size(path)
        size = sizes[loc]
        if isinstance(size, str):
            pending.setdefault((loc, f"tensors point at '{loc}', which {size}"), []).append(
                _finding(t.name, f"{name} points at '{loc}', which {size}", "copy the external data file next to the model or re-export"))
            continue
        try:
            offset = int(info.get("offset", 0) or 0)
            length = int(info["length"]) if info.get("length") not in (None, "") else None
        except ValueError:
            out.append(_finding(t.name, f"{name} has a non-integer offset/length {info}",
                          "re-export"))
            continue
        expected = tensor_nbytes(t)
        if length is None:
            length = expected if expected is not None else size - offset
        if offset < 0 or length < 0 or offset + length > size:
            pending.setdefault((loc, f"tensors read past the end of '{loc}', which has only {size} bytes"), []).append(
                _finding(t.name, f"{name} reads bytes {offset}..{offset + length} of '{loc}', which has only {size} bytes",
                   "the data file is truncated or from another export: re-export, or fetch the real file (Git LFS?)"))
        elif expected is not None and length != expected:
            out.append(_finding(t.name,
                          f"{name} ({type_name(t.data_type)} {list(t.dims)}) needs {expected} bytes, its external length is {length}",
                          "re-export; the graph and its data file disagree"))
    for (_loc, summary), items in pending.items():  # a missing or truncated file: one finding for all its tensors
        out += grouped(items, summary)
    return out


def _data_file_size(path: Path) -> int | str:
    """The size of a regular file, else what is wrong with it (stat only)."""
    try:
        st = os.stat(path)
    except OSError:
        return "does not exist"
    return st.st_size if stat.S_ISREG(st.st_mode) else "is not a regular file (device, socket or pipe)"
