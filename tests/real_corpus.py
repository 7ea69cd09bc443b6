"""Rebuild the real AMD packages of tests/data/real/ as folders raipack can validate.

Each package folder there holds `provenance.json` (where every file comes from, and the
size of each file the package ships) and `files/` (the files kept verbatim; a `.gz` is
a verbatim file compressed). `rebuild(name, root)` writes the package's layout: the kept
files as they are, every other file as a placeholder of its name and real size (weights
sparse, so a 1 GB file costs no disk; a graph a small ONNX decoder with the I/O contract
the package's genai_config.json declares, its weights in the data file it names; a JSON
file that is not public here a minimal stand-in; a log its recorded head and tail; an NPU weights
header a protobuf header of AMD's format reaching to its weights file's real size).
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from amd_header import header_bytes
from factory import Dims, make_graph, save_graph
from raipack.npu.layout import weights_sibling

REAL = Path(__file__).resolve().parent / "data" / "real"


def packages() -> list[str]:
    return sorted(p.name for p in REAL.iterdir() if (p / "provenance.json").is_file())


def provenance(name: str) -> dict:
    return json.loads((REAL / name / "provenance.json").read_text())


def rebuild(name: str, root: Path) -> Path:
    prov = provenance(name)
    pkg = Path(root) / prov["package"]
    pkg.mkdir(parents=True)
    _copy_kept(REAL / name / "files", pkg)
    genai = _genai(pkg)
    graph = genai.get("model", {}).get("decoder", {}).get("filename") if genai else None
    for rel, entry in sorted(prov["files"].items()):
        path = pkg / rel
        if entry.get("kept", "").startswith("verbatim"):
            assert path.stat().st_size == entry["size"], f"{name}/{rel}: kept file is not the recorded size"
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel == graph:
            _graph(pkg, rel, genai, prov["files"])
        elif "head" in entry:
            _head_tail(path, entry)
        elif rel.endswith(".json"):
            text = json.dumps(_json_stand_in(rel)).encode()
            path.write_bytes(text + b" " * (entry["size"] - len(text)))  # JSON allows trailing whitespace
        elif rel.endswith(".pb.bin"):
            _npu_header(path, rel, prov["files"])
        elif rel.endswith((".txt", ".md", ".jinja")):  # text stays text (a sparse file of zeros reads as binary)
            path.write_bytes(b" " * entry["size"])
        elif not path.exists():
            with open(path, "wb") as fh:
                fh.truncate(entry["size"])
    if prov.get("rebuild", {}).get("cache_consts_from_meta"):
        _cache_consts(pkg)
    return pkg


def _cache_consts(pkg: Path) -> None:
    """The `.const` files each cache meta names, at the sizes it records (the public copy
    uploaded the meta file without them; AMD's folder has them, see provenance.json)."""
    for meta in sorted(pkg.glob("*cache/*_meta.json")):
        for entry in json.loads(meta.read_bytes())["tensor_map"].values():
            if "file_name" in entry:
                path = pkg / entry["file_name"].replace("\\", "/")
                with open(path, "wb") as fh:
                    fh.truncate(entry["file_size"])


def _copy_kept(src: Path, dst: Path) -> None:
    for f in sorted(src.rglob("*")):
        if f.is_dir():
            continue
        rel = f.relative_to(src)
        out = dst / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if f.suffix == ".gz":
            out.with_suffix("").write_bytes(gzip.decompress(f.read_bytes()))
        else:
            shutil.copyfile(f, out)


def _genai(pkg: Path) -> dict | None:
    path = pkg / "genai_config.json"
    return json.loads(path.read_bytes()) if path.exists() else None


def _graph(pkg: Path, rel: str, genai: dict, files: dict) -> None:
    """A decoder with the declared I/O contract; its weights in the data file the package
    ships next to it (`<graph>.data` or `.onnx.data`), grown to that file's real size."""
    dec = genai["model"]["decoder"]
    d = Dims(layers=dec["num_hidden_layers"], heads=dec["num_attention_heads"], kv_heads=dec["num_key_value_heads"],
             head_size=dec["head_size"], vocab=genai["model"]["vocab_size"], hidden_size=128)
    data = next(f for f in (rel + ".data", rel.removesuffix(".onnx") + ".data") if f in files)
    model = make_graph(d)
    if "position_ids" in dec.get("inputs", {}):  # the builder's graphs take it when the config names it
        model.graph.input.insert(2, helper.make_tensor_value_info(dec["inputs"]["position_ids"], TensorProto.INT64, ["batch_size", "sequence_length"]))
    save_graph(model, pkg, rel, data)
    _pad_graph(pkg / rel, files[rel]["size"])
    with open(pkg / data, "r+b") as fh:
        fh.truncate(files[data]["size"])


def _pad_graph(path: Path, size: int) -> None:
    """Grow the graph to the real file's size with a doc string (a parser reads it as any graph)."""
    model = onnx.load_model(str(path), load_external_data=False)
    pad = 0
    for _ in range(4):  # the doc string's length prefix grows by a byte or two as it grows
        pad = max(0, pad + size - model.ByteSize())
        model.doc_string = "." * pad
    path.write_bytes(model.SerializeToString())


def _npu_header(path: Path, rel: str, files: dict) -> None:
    """AMD's NPU weights header (its bytes are a Git LFS object, not public here) as AMD's writer
    lays one out, at its real size: it names the sibling weights file and places one weight that
    ends exactly at that file's recorded size (the tightest header the real sizes allow)."""
    weights = weights_sibling(rel)
    tensors = [("MatMulNBits_2_0", 0, files[weights]["size"])] if weights in files else []
    path.write_bytes(header_bytes(weights.rsplit("/", 1)[-1] if tensors else "", tensors, size=files[rel]["size"]))


def _head_tail(path: Path, entry: dict) -> None:
    head, tail = entry["head"].encode(), entry["tail"].encode()
    filler = entry["size"] - len(head) - len(tail)
    path.write_bytes(head + b"." * filler + tail)


def _json_stand_in(rel: str) -> dict:
    """Content not public here (an LFS pointer in the copy, or too large to keep)."""
    if rel == "tokenizer.json":
        return {"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}
    return {}
