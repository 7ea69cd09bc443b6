"""What `raipack validate` is fast by (issue 13), each held by a test: it never reads the weights'
bytes unless --verify-hashes asks, it reads the graph with onnx's messages but without `import onnx`
(and the same messages and values as onnx), a graph too small to pass the caps is not counted field
by field, and the external-data scan stats each data file once, not once per tensor."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper, numpy_helper

from factory import reference_package
from helpers import edit_json
from raipack.core import onnxproto, protowire
from raipack.npu.external_data import external_data_refs
from raipack.validate import validate

P16 = "reference-16K"
_OPENED: list[set[str]] = []  # the files opened or mapped while one _read_during runs


def _record(event, args):
    if not _OPENED:
        return
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED[-1].add(os.fsdecode(args[0]))
    elif event == "mmap.__new__" and isinstance(args[0], int) and args[0] >= 0:
        _OPENED[-1].add(os.readlink(f"/proc/self/fd/{args[0]}") + " (mmap)")


sys.addaudithook(_record)  # audit hooks stay for the process; this one records only inside _read_during


def _rchar() -> int:
    """Bytes this process has passed through read() calls so far (the OS's count, whatever Python API read them)."""
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("rchar:"))


def _read_during(fn, pkg: Path) -> tuple[int, set[str]]:
    """(bytes read, package files opened or mapped) while fn() runs."""
    _OPENED.append(set())
    try:
        before = _rchar()
        fn()
        read = _rchar() - before
    finally:
        opened = _OPENED.pop()
    root = str(pkg.resolve())
    return read, {p[len(root) + 1:] for p in opened if p.startswith(root + "/")}


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's /proc/self/io to count the bytes read")
def test_validate_reads_no_weights_bytes_unless_verify_hashes():
    pkg = reference_package(P16)
    validate(pkg)  # imports, data files and compiled schemas: the second run reads only the package
    files = {p.relative_to(pkg).as_posix(): p.stat().st_size for p in pkg.rglob("*") if p.is_file()}
    weights = {rel for rel in files if rel.endswith((".onnx.data", ".bin")) and rel != "model.pb.bin"}
    others = sum(size for rel, size in files.items() if rel not in weights)
    # every other file may be read twice; each weights file at most its first KiB (the scan's head)
    bound = 2 * others + 1024 * len(weights) + 65536
    assert files["model.bin"] > bound, (files, bound)  # else the bound could not see model.bin read

    read, opened = _read_during(lambda: validate(pkg), pkg)
    assert read <= bound, (read, others)
    assert "model.onnx.data" not in opened, opened  # its size is all RP702 needs
    assert not any(rel.endswith(" (mmap)") for rel in opened), opened

    hashed, opened = _read_during(lambda: validate(pkg, verify_hashes=True), pkg)
    assert "model.onnx.data" in opened  # the instrument sees what hashing opens and reads
    assert hashed >= read + files["model.onnx.data"]


def test_validate_imports_neither_onnx_nor_rich():
    """The graph is parsed with onnx's generated messages only: `import onnx` (numpy, onnx.helper, the
    operator schemas) costs more than the rest of a validation, and rich is only for the build's bars."""
    pkg = reference_package(P16)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "raipack.cli", "validate", str(pkg)], capture_output=True, text=True)
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert proc.returncode == 0 and "ok:" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert {"raipack.npu.graph", "google.protobuf.descriptor_pool"} <= imported  # the graph reader ran, on protobuf
    assert not {"onnx", "onnx.helper", "rich"} & imported, sorted(imported)


def test_messages_are_onnx_own_when_onnx_is_imported_later():
    """A ModelProto parsed before `import onnx` is an onnx.ModelProto: one module, one set of classes."""
    graph = reference_package(P16) / "model.onnx"
    code = ("import sys; from raipack.core import onnxproto\n"
            "m = onnxproto.load_model(open(sys.argv[1], 'rb').read())\n"
            "assert 'onnx' not in sys.modules\n"
            "import onnx\n"
            "print(isinstance(m, onnx.ModelProto), onnx.TensorProto is onnxproto.TensorProto, len(m.graph.node))")
    proc = subprocess.run([sys.executable, "-c", code, str(graph)], capture_output=True, text=True)
    nodes = len(onnx.load(str(graph), load_external_data=False).graph.node)
    assert proc.stdout.split() == ["True", "True", str(nodes)], proc.stdout + proc.stderr


def test_load_model_parses_as_onnx_does():
    raw = (reference_package(P16) / "model.onnx").read_bytes()
    assert onnxproto.load_model(raw).SerializeToString() == onnx.load_model_from_string(raw).SerializeToString()
    for load in (onnx.load_model_from_string, onnxproto.load_model):
        with pytest.raises(DecodeError):
            load(raw[:-3])


def test_attribute_values_match_onnx_helper():
    t = numpy_helper.from_array(__import__("numpy").arange(6, dtype="float32").reshape(2, 3), "t")
    g = helper.make_graph([], "g", [], [])
    values = [1.5, 7, b"s", t, g, [1.0, 2.0], [1, 2, 3], [b"a", b"b"], [t, t], [g], helper.make_tensor_type_proto(1, [2])]
    attrs = [helper.make_attribute(f"a{i}", v) for i, v in enumerate(values)]
    attrs += [onnx.AttributeProto(name="u", type=onnx.AttributeProto.UNDEFINED)]
    for a in attrs:
        assert onnxproto.get_attribute_value(a) == helper.get_attribute_value(a), a.name
    ref = onnx.AttributeProto(name="r", ref_attr_name="x", type=onnx.AttributeProto.INT)
    for getter in (helper.get_attribute_value, onnxproto.get_attribute_value):
        with pytest.raises(ValueError):
            getter(ref)


@pytest.mark.parametrize("dims", [[], [7], [3, 5], [2, 0, 9]])
def test_tensor_sizes_match_onnx(dims):
    """pipeline/data/onnx_element_bits.json gives every type onnx knows the size onnx gives it."""
    nibble = {TensorProto.UINT4, TensorProto.INT4, TensorProto.FLOAT4E2M1}
    count = 1
    for d in dims:
        count *= d
    for name, dtype in TensorProto.DataType.items():
        t = TensorProto(name="x", data_type=dtype, dims=dims)
        try:
            expected = (count + 1) // 2 if dtype in nibble else count * helper.tensor_dtype_to_np_dtype(dtype).itemsize
        except KeyError:
            expected = None
        assert onnxproto.tensor_nbytes(t) == expected, name


def _empty_nodes(n: int) -> bytes:
    """A ModelProto of one graph holding n empty nodes: the most nodes per byte."""
    nodes = b"\x0a\x00" * n  # GraphProto.node (field 1), length 0
    return b"\x3a" + protowire_len(len(nodes)) + nodes  # ModelProto.graph (field 7)


def protowire_len(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


@pytest.mark.parametrize("n", [1, 9, 10, 11, 60, 200])
def test_fits_only_when_the_limits_cannot_be_passed(n):
    """`fits` lets the graph reader skip counting; it must never say so of bytes that pass a limit."""
    raw = _empty_nodes(n)
    limits = {"onnx.NodeProto": 10}
    counts = protowire.count(raw, onnxproto.ModelProto.DESCRIPTOR, 100, limits)
    if protowire.fits(len(raw), 100, limits):
        assert counts.over is None
    assert counts.over is not None or n <= 10
    assert protowire.fits(len(raw), 10**9, {"onnx.NodeProto": 10**9})
    assert not protowire.fits(len(raw), 0, {})


def test_external_data_stats_each_file_once(tmp_path, monkeypatch):
    """The scan resolves and stats a data file once, however many tensors it holds (an 8B graph has
    hundreds): its system calls must not grow with the tensor count."""
    import numpy as np

    calls = {"n": 0}
    real_lstat, real_stat = os.lstat, os.stat

    def counting(real):
        def call(*a, **k):
            calls["n"] += 1
            return real(*a, **k)
        return call

    def syscalls(tensors: int) -> int:
        folder = tmp_path / str(tensors)
        folder.mkdir()
        inits = [numpy_helper.from_array(np.full((4, 4), i, np.float32), f"w{i}") for i in range(tensors)]
        model = helper.make_model(helper.make_graph([], "g", [], [], initializer=inits))
        onnx.save(model, folder / "model.onnx", save_as_external_data=True, all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=0)
        loaded = onnx.load(folder / "model.onnx", load_external_data=False)
        calls["n"] = 0
        monkeypatch.setattr(os, "lstat", counting(real_lstat))
        monkeypatch.setattr(os, "stat", counting(real_stat))
        try:
            assert external_data_refs(loaded, folder) == []
        finally:
            monkeypatch.setattr(os, "lstat", real_lstat)
            monkeypatch.setattr(os, "stat", real_stat)
        return calls["n"]

    few, many = syscalls(2), syscalls(40)
    assert many == few, (few, many)


@pytest.mark.parametrize("bad_id", [[1], {"id": 1}, "7"])
def test_tokenizer_size_skips_ids_that_are_not_integers(make_pkg, bad_id):
    """RP502 takes the largest integer id without building sets of the vocabulary (49 000 ids for
    SmolLM2, 128 000 for Llama 3); a list as an id made the set raise TypeError (a traceback)."""
    pkg = make_pkg("1.8.0-npu-16K")
    edit_json(pkg / "tokenizer.json", lambda d: d["model"]["vocab"].update({"odd": bad_id}))
    result = validate(pkg, select=("RP502",))
    assert result.checks_run == ["RP502"] and result.findings == []
    edit_json(pkg / "tokenizer.json", lambda d: d["model"]["vocab"].update({"odd": 10**6}))
    (hit,) = validate(pkg, select=("RP502",)).findings  # the largest id still counts
    assert hit.path == "tokenizer.json" and "1000001 tokens" in hit.message
