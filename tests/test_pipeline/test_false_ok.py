"""A damaged package is never called valid, and reading one never runs away (issue 11, items 7 and 8).

Each case builds a clean AMD-profile package, breaks one thing, runs `raipack validate` (or
`inspect`) and asserts the exit code, the finding (check id, file, pointer) and that no traceback
was printed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from helpers import edit_json, run_cli, ryzen
from raipack.cli import main
from raipack.core import onnxproto
from raipack.core.package import GRAPH_MAX_BYTES, GRAPH_MAX_NODES, JsonError, Package

P16 = "1.8.0-npu-16K"
ROOT = Path(__file__).resolve().parents[2]


def validate(capsys, pkg, *args):
    """(exit code, findings, stdout + stderr) of `raipack validate --format json`."""
    code, out, err = run_cli(capsys, "validate", "--format", "json", *args, pkg)
    assert "Traceback" not in out + err, out + err
    return code, json.loads(out)["results"][0]["findings"], out + err


def errors(findings, check_id):
    return [f for f in findings if f["check_id"] == check_id and f["severity"] == "error"]


# -- external data inside subgraphs ----------------------------------------------------------------

def _external(name: str, location: str, offset: int = 0, length: int = 16) -> onnx.TensorProto:
    t = helper.make_tensor(name, TensorProto.FLOAT, [4], [0.0] * 4)
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t


def _branch(name: str, tensor: onnx.TensorProto) -> onnx.GraphProto:
    out = helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [4])
    return helper.make_graph([helper.make_node("Identity", [tensor.name], [f"{name}_out"])], name, [], [out], [tensor])


def add_if(pkg: Path, tensor: onnx.TensorProto, nested: bool = False) -> None:
    """An `If` node whose else branch holds `tensor` (inside a `Loop` body when `nested`)."""
    model = onnx.load(str(pkg / "model.onnx"), load_external_data=False)
    ok = _branch("then", _external("then_w", "model.onnx.data"))
    node = helper.make_node("If", ["attention_mask"], ["rope_out"], name="/rope/If", then_branch=ok, else_branch=_branch("else", tensor))
    if nested:
        body = helper.make_graph([node], "body", [], [helper.make_tensor_value_info("rope_out", TensorProto.FLOAT, [4])])
        node = helper.make_node("Loop", ["", ""], ["loop_out"], name="/rope/Loop", body=body)
    model.graph.node.append(node)
    (pkg / "model.onnx").write_bytes(model.SerializeToString())


@pytest.mark.parametrize("location, offset, expected", [
    ("../../etc/passwd", 0, "outside the model folder"),
    ("/etc/passwd", 0, "outside the model folder"),
    ("model.onnx.data", 1 << 40, "which has only"),
], ids=["dotdot", "absolute", "past-the-end"])
@pytest.mark.parametrize("nested", [False, True], ids=["if", "loop-if"])
def test_external_data_in_a_subgraph_is_checked(make_pkg, capsys, location, offset, expected, nested):
    pkg = make_pkg(P16)
    add_if(pkg, _external("else_w", location, offset), nested)
    code, findings, _ = validate(capsys, pkg)
    hits = errors(findings, "RP702")
    assert code == 1
    assert [(f["path"], f["pointer"]) for f in hits] == [("model.onnx", "else_w")]  # not then_w, whose data is fine
    assert expected in hits[0]["message"] and "subgraph else_branch of node '/rope/If'" in hits[0]["message"]


# -- JSON the runtime may read differently ------------------------------------------------------

def test_duplicate_key_names_the_key_both_values_and_the_object(make_pkg, capsys):
    pkg = make_pkg(P16)
    path = pkg / "genai_config.json"
    text = path.read_text()
    assert text.count('"hybrid_opt_token_backend": "npu"') == 1
    path.write_text(text.replace('"hybrid_opt_token_backend": "npu"', '"hybrid_opt_token_backend": "cpu", "hybrid_opt_token_backend": "npu"'))
    code, findings, _ = validate(capsys, pkg)
    obj = "/model/decoder/session_options/provider_options/0/RyzenAI"
    (hit,) = errors(findings, "RP203")
    assert code == 1
    assert (hit["path"], hit["pointer"]) == ("genai_config.json", f"{obj}/hybrid_opt_token_backend")
    assert f"at {obj}" in hit["message"] and '"cpu", then "npu"' in hit["message"]


def test_duplicate_key_in_any_json_file(make_pkg, capsys):
    pkg = make_pkg(P16)
    meta = sorted((pkg / "cache").glob("*_meta.json"))[0]
    meta.write_text('{"dd_meta_major_version": 1, ' + meta.read_text().lstrip()[1:])
    (pkg / "tokenizer_config.json").write_text('{"a": {"b": 1, "b": 2}}')
    code, findings, _ = validate(capsys, pkg)
    hits = {(f["path"], f["pointer"]) for f in errors(findings, "RP203")}
    assert code == 1
    assert hits == {(meta.relative_to(pkg).as_posix(), "/dd_meta_major_version"), ("tokenizer_config.json", "/a/b")}


@pytest.mark.parametrize("literal", ["1e999", "-1e999", "NaN", "Infinity"])
def test_non_finite_number_is_refused_with_its_pointer(make_pkg, capsys, literal):
    pkg = make_pkg(P16)
    path = pkg / "genai_config.json"
    path.write_text(path.read_text().replace('"temperature": 0.6', f'"temperature": {literal}'))
    code, findings, _ = validate(capsys, pkg)
    hits = errors(findings, "RP201")
    assert code == 1
    assert [(f["path"], f["pointer"]) for f in hits] == [("genai_config.json", "/search/temperature")]
    assert literal in hits[0]["message"]


# -- zero and negative dimensions ---------------------------------------------------------------

def test_negative_dims_inside_text_config(make_pkg, capsys):
    pkg = make_pkg(P16)

    def nest(doc):
        doc["text_config"] = {k: doc.pop(k) for k in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "vocab_size", "head_dim")}
        doc["text_config"]["num_key_value_heads"] = -1
    edit_json(pkg / "config.json", nest)
    code, findings, _ = validate(capsys, pkg)
    assert code == 1
    assert [(f["path"], f["pointer"]) for f in errors(findings, "RP202")] == [("config.json", "/text_config/num_key_value_heads")]


@pytest.mark.parametrize("key, value", [("max_length_for_kv_cache", "-1"), ("max_length_for_kv_cache", "0"), ("hybrid_opt_chunk_context_threshold", "-5")])
def test_negative_length_option(make_pkg, capsys, key, value):
    pkg = make_pkg(P16)
    edit_json(pkg / "genai_config.json", lambda d: ryzen(d).__setitem__(key, value))
    code, findings, _ = validate(capsys, pkg)
    hits = errors(findings, "RP401")
    assert code == 1
    assert [f["pointer"] for f in hits] == [f"/model/decoder/session_options/provider_options/0/RyzenAI/{key}"]


def test_a_negative_vocabulary_is_one_finding_not_a_cascade(make_pkg, capsys):
    """RP202 names the field; the cross-file checks do not compare token ids against -5 tokens."""
    pkg = make_pkg(P16)
    edit_json(pkg / "config.json", lambda d: d.__setitem__("vocab_size", -5))
    code, findings, _ = validate(capsys, pkg)
    assert code == 1
    assert [(f["check_id"], f["path"], f["pointer"]) for f in findings if f["severity"] == "error"] == [("RP202", "config.json", "/vocab_size")]


# -- the graph: size, node count, memory -----------------------------------------------------------

def test_graph_above_the_size_cap_is_not_read(make_pkg, capsys, monkeypatch):
    pkg = make_pkg(P16)
    with open(pkg / "model.onnx", "r+b") as fh:
        fh.truncate(GRAPH_MAX_BYTES + 1)  # sparse: costs no disk
    monkeypatch.setattr(onnx, "load_model_from_string", lambda *a, **k: pytest.fail("parsed an oversized graph"))
    code, findings, _ = validate(capsys, pkg)
    (hit,) = errors(findings, "RP701")
    assert code == 1 and hit["path"] == "model.onnx"
    assert "too large to be a graph with external weights" in hit["message"]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def add_empty_nodes(pkg: Path, count: int) -> None:
    """Append `count` empty nodes to model.onnx (a second `graph` field merges into the first)."""
    graph = b"\x0a\x00" * count  # GraphProto.node, length 0
    with open(pkg / "model.onnx", "ab") as fh:
        fh.write(b"\x3a" + _varint(len(graph)) + graph)  # ModelProto.graph


def test_graph_with_too_many_nodes_is_refused_before_parsing(make_pkg, capsys):
    pkg = make_pkg(P16)
    add_empty_nodes(pkg, GRAPH_MAX_NODES + 1)
    code, findings, _ = validate(capsys, pkg)
    (hit,) = errors(findings, "RP701")
    assert code == 1 and hit["path"] == "model.onnx"
    assert f"more than {GRAPH_MAX_NODES} nodes" in hit["message"]


def test_20_mb_of_empty_nodes_costs_little(make_pkg, tmp_path):
    """The issue's case: 20 MB of empty nodes took 49 s and 1.7 GB. Now the count stops early.

    The peak is the child's own VmHWM: its ru_maxrss would carry the forking test worker's size
    across exec (Linux keeps the larger of the two), hundreds of MiB after a quantize test."""
    pkg = make_pkg(P16)
    add_empty_nodes(pkg, 10_000_000)
    script = ("import sys\nfrom raipack.cli import main\n"
              "try:\n    main(['validate', '--format', 'json', sys.argv[1]])\n"
              "finally:\n    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
              "    print('RSS_MIB', int(hwm) // 1024, file=sys.stderr)")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script, str(pkg)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    seconds = time.monotonic() - start
    rss = int(proc.stderr.rsplit("RSS_MIB", 1)[1])
    assert "Traceback" not in proc.stderr and proc.returncode == 1, proc.stderr
    assert [f["check_id"] for f in json.loads(proc.stdout)["results"][0]["findings"] if f["severity"] == "error"] == ["RP701"]
    assert seconds < 10 and rss < 400, (seconds, rss)


def test_memory_error_while_parsing_is_a_finding(make_pkg, capsys, monkeypatch):
    """`MemoryError()` has an empty message; RP701 used to index its first line (IndexError)."""
    def out_of_memory(*_a, **_k):
        raise MemoryError()

    monkeypatch.setattr(onnx, "load", out_of_memory)
    monkeypatch.setattr(onnxproto, "load_model", out_of_memory)  # the graph reader's parse
    pkg = make_pkg(P16)
    code, findings, _ = validate(capsys, pkg)
    (hit,) = errors(findings, "RP701")
    assert code == 1 and hit["path"] == "model.onnx" and "memory" in hit["message"]


def test_memory_error_while_parsing_json_is_a_finding(make_pkg, capsys, monkeypatch):
    real_loads = json.loads

    def loads(text, **kw):
        if kw.get("object_pairs_hook") and "max_prompt_length" in text:  # the package reader, on rai_config.json
            raise MemoryError()
        return real_loads(text, **kw)

    monkeypatch.setattr(json, "loads", loads)
    pkg = make_pkg(P16)
    code, findings, _ = validate(capsys, pkg)
    (hit,) = errors(findings, "RP201")
    assert code == 1 and hit["path"] == "rai_config.json" and "memory" in hit["message"]


# -- special files and paths outside the package, refused before they are opened -----------------

@contextmanager
def deadline(seconds: int):
    def expire(*_):
        raise TimeoutError("blocked reading the file")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_a_file_swapped_for_a_fifo_after_the_scan_is_refused(make_pkg):
    pkg_dir = make_pkg(P16)
    pkg = Package.scan(pkg_dir)
    (pkg_dir / "genai_config.json").unlink()
    os.mkfifo(pkg_dir / "genai_config.json")  # a reader would block here forever
    with deadline(5), pytest.raises(JsonError, match="not a regular file"):
        pkg.json("genai_config.json")


def test_a_file_swapped_for_a_link_out_of_the_package_is_refused(make_pkg, tmp_path):
    pkg_dir = make_pkg(P16)
    pkg = Package.scan(pkg_dir)
    outside = tmp_path / "secret.json"
    outside.write_text('{"max_prompt_length": {"1.8.0": 4096}}')
    (pkg_dir / "rai_config.json").unlink()
    (pkg_dir / "rai_config.json").symlink_to(outside)
    with pytest.raises(JsonError, match="resolves outside the package"):
        pkg.json("rai_config.json")


def test_the_graph_is_read_through_the_same_guard(make_pkg, capsys, monkeypatch):
    pkg_dir = make_pkg(P16)
    real_scan = Package.scan.__func__

    def scan_then_swap(cls, root):
        pkg = real_scan(cls, root)
        (Path(root) / "model.onnx").unlink()
        os.mkfifo(Path(root) / "model.onnx")
        return pkg

    monkeypatch.setattr(Package, "scan", classmethod(scan_then_swap))
    with deadline(20):
        code, findings, _ = validate(capsys, pkg_dir)
    (hit,) = errors(findings, "RP701")
    assert code == 1 and hit["path"] == "model.onnx" and "not a regular file" in hit["message"]


# -- rai_config.json values of the wrong type ----------------------------------------------------

RAI_CONFIGS = [
    ({"max_prompt_length": {"1.8.0": "4096"}}, "/max_prompt_length/1.8.0"),
    ({"max_prompt_length": {"1.8.0": "abc"}}, "/max_prompt_length/1.8.0"),
    ({"max_prompt_length": "4096"}, "/max_prompt_length"),
    ({"max_prompt_length": {"1.8.0": "9" * 5000}}, "/max_prompt_length/1.8.0"),
]


def test_rai_config_strings_are_findings_not_tracebacks(make_pkg, capsys):
    for doc, pointer in RAI_CONFIGS:
        pkg = make_pkg(P16)
        (pkg / "rai_config.json").write_text(json.dumps(doc))
        code, findings, _ = validate(capsys, pkg)
        assert code == 1
        assert [(f["path"], f["pointer"]) for f in errors(findings, "RP202")] == [("rai_config.json", pointer)]
        for args in (["inspect", str(pkg)], ["inspect", "--json", str(pkg)]):
            with pytest.raises(SystemExit) as info:
                main(args)
            out, err = capsys.readouterr()
            assert info.value.code == 0 and "Traceback" not in out + err, out + err
