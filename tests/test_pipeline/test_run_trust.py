"""`raipack run` on damaged packages: every weights file checked against manifest.json, no file read from
outside the package or from a special file, and every bad input one sentence with a documented exit code
(0 answered, 1 the package cannot be run, 2 usage error)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import edit_json, ryzen
from raipack.cli import main

PROMPT = "What is the capital of France?"


@pytest.fixture(scope="session")
def package(tiny_quark, tmp_path_factory) -> Path:
    """A reference-4K package fused from the tiny Quark export, its manifest written by raipack (read-only)."""
    from raipack.core.manifest import write
    from raipack.npu.profile import get as get_profile
    from raipack.stages.export.builder import export
    from raipack.stages.fuse.reference import fuse

    root = tmp_path_factory.mktemp("run-trust")
    quark = root / "quark"
    shutil.copytree(tiny_quark.quark_dir, quark)
    edit_json(quark / "config.json", lambda d: d.update(max_position_embeddings=4096))
    export(quark, root / "oga")
    pkg = root / "Tiny_rai_1.8.0_npu_4K"
    fuse(root / "oga", pkg, get_profile("reference-4K"), quark_dir=quark)
    write(pkg, "package")
    return pkg


@pytest.fixture
def pkg(package, tmp_path) -> Path:
    """A copy of the package to damage."""
    return Path(shutil.copytree(package, tmp_path / package.name))


def run(capsys, pkg, prompt=PROMPT):
    with pytest.raises(SystemExit) as info:
        main(["run", str(pkg), "--prompt", prompt, "-n", "4"])
    out, err = capsys.readouterr()
    return info.value.code, out, err


def one_sentence(err: str) -> str:
    """The ERROR line of a refusal, after checking the refusal is that line and a hint, nothing else."""
    lines = err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("ERROR: ") and lines[1].startswith("  hint: "), err
    return lines[0]


def external_span(pkg: Path, location: str = "model.onnx.data") -> tuple[int, int]:
    """(offset, length) of the largest tensor the graph keeps in `location` (the float lm_head)."""
    import onnx

    model = onnx.load(str(pkg / "model.onnx"), load_external_data=False)
    spans = []
    for t in model.graph.initializer:
        ext = {e.key: e.value for e in t.external_data}
        if ext.get("location") == location:
            spans.append((int(ext["length"]), int(ext.get("offset", 0))))
    length, offset = max(spans)
    return offset, length


def test_a_clean_package_answers_and_its_weights_were_checked(package, capsys):
    code, out, err = run(capsys, package)
    assert code == 0 and out.strip(), err
    assert "[cpu-reference]" in err and "manifest.json is missing" not in err


@pytest.mark.parametrize("damage", ["zero", "swap"])
def test_changed_model_onnx_data_is_refused(pkg, capsys, damage):
    """lm_head zeroed or its halves swapped, same size: the manifest's sha256 catches it before loading."""
    offset, length = external_span(pkg)
    with open(pkg / "model.onnx.data", "r+b") as fh:
        fh.seek(offset)
        data = fh.read(length)
        fh.seek(offset)
        fh.write(bytes(length) if damage == "zero" else data[length // 2:] + data[: length // 2])
    code, out, err = run(capsys, pkg)
    line = one_sentence(err)
    assert code == 1 and out == ""
    assert "model.onnx.data has sha256" in line and "manifest.json records" in line


@pytest.mark.parametrize("manifest", [True, False])
def test_truncated_model_onnx_data_is_refused(pkg, capsys, manifest):
    offset, length = external_span(pkg)
    if not manifest:
        (pkg / "manifest.json").unlink()
    os.truncate(pkg / "model.onnx.data", offset + length // 2)
    code, out, err = run(capsys, pkg)
    line = one_sentence(err)
    assert code == 1 and out == ""
    assert "model.onnx.data is" in line
    assert ("manifest.json records" in line) if manifest else ("truncated" in line)


def test_weights_file_added_after_the_build_is_refused(pkg, capsys):
    shutil.copyfile(pkg / "model.onnx.data", pkg / "other.onnx.data")
    code, _, err = run(capsys, pkg)
    assert code == 1 and "other.onnx.data is not listed in manifest.json" in one_sentence(err)


def test_without_a_manifest_it_runs_and_says_what_was_not_checked(pkg, capsys):
    (pkg / "manifest.json").unlink()
    code, out, err = run(capsys, pkg)
    assert code == 0 and out.strip() and "manifest.json is missing" in err


@pytest.mark.parametrize("field", ["filename", "external_data_file"])
@pytest.mark.parametrize("target", ["/dev/zero", "../../../etc/passwd", "nested/../../outside.onnx", "link-out", "missing.onnx"])
def test_config_paths_outside_the_package_are_refused_before_opening(pkg, capsys, tmp_path, field, target):
    (tmp_path / "outside.onnx").write_bytes((pkg / "model.onnx").read_bytes())
    if target == "link-out":
        (pkg / "link.onnx").symlink_to("/dev/zero")
        target = "link.onnx"
    edit_json(pkg / "genai_config.json", lambda d: (d["model"]["decoder"] if field == "filename" else ryzen(d)).__setitem__(field, target))
    (pkg / "manifest.json").unlink()  # the paths alone must be refused
    code, out, err = run(capsys, pkg)
    line = one_sentence(err)
    assert code == 1 and out == ""
    assert "genai_config.json" in line or "link.onnx is a symlink that leaves the package" in line, line


FIFO_DRIVER = """
import json, sys
from raipack.cli import main
for pkg in sys.argv[2:]:
    prompt = sys.argv[1] if pkg.endswith("utf8") else "hi"
    try:
        main(["run", pkg, "--prompt", prompt, "-n", "2"])
    except SystemExit as e:
        print(json.dumps([pkg, e.code]), flush=True)
"""


def test_fifos_and_a_non_utf8_prompt_end_with_a_sentence_not_a_hang(package, tmp_path):
    """A FIFO named by genai_config.json (graph, NPU header) or standing as one of the files the runtime
    reads would block a reader forever: each is refused before it is opened. The prompt arrives as raw
    command-line bytes that are not UTF-8. All run in one child process, under a timeout."""
    cases = {}
    for case in ("filename", "external_data_file", "genai_config.json", "tokenizer.json", "utf8"):
        pkg = Path(shutil.copytree(package, tmp_path / case))
        if case in ("filename", "external_data_file"):
            os.mkfifo(pkg / "pipe.onnx")
            edit_json(pkg / "genai_config.json", lambda d, case=case: (d["model"]["decoder"] if case == "filename" else ryzen(d)).__setitem__(case, "pipe.onnx"))
        elif case != "utf8":
            (pkg / case).unlink()
            os.mkfifo(pkg / case)
        cases[str(pkg)] = case
    proc = subprocess.run([sys.executable, "-c", FIFO_DRIVER, b"caf\xe9 \xff?", *cases], capture_output=True, timeout=240)
    codes = {cases[p]: code for p, code in map(json.loads, proc.stdout.decode().splitlines())}
    err = proc.stderr.decode("utf-8", "replace")
    assert codes == {"filename": 1, "external_data_file": 1, "genai_config.json": 1, "tokenizer.json": 1, "utf8": 2}, err
    assert "Traceback" not in err
    assert err.count("is not a regular file") == 4, err
    assert "the prompt is not valid UTF-8 text (byte 0xe9 at position 3)" in err


def test_eos_token_id_that_is_not_a_number(pkg, capsys):
    edit_json(pkg / "genai_config.json", lambda d: d["model"].update(eos_token_id="abc"))
    (pkg / "manifest.json").unlink()
    code, _, err = run(capsys, pkg)
    line = one_sentence(err)
    assert code == 1 and "genai_config.json" in line and "/model/eos_token_id" in line and '"abc"' in line


@pytest.mark.parametrize("manifest", [True, False])
def test_corrupt_tokenizer_json(pkg, capsys, manifest):
    if not manifest:
        (pkg / "manifest.json").unlink()
    doc = json.loads((pkg / "tokenizer.json").read_text())
    del doc["added_tokens"]
    doc["model"]["vocab"] = 5
    (pkg / "tokenizer.json").write_text(json.dumps(doc))
    code, out, err = run(capsys, pkg)
    line = one_sentence(err)
    assert code == 1 and out == ""
    assert "tokenizer.json" in line and ("manifest.json records" in line if manifest else "cannot be loaded" in line)


def test_broken_graph_is_a_sentence(pkg, capsys):
    (pkg / "manifest.json").unlink()
    data = (pkg / "model.onnx").read_bytes()
    (pkg / "model.onnx").write_bytes(data[: len(data) // 3])
    code, _, err = run(capsys, pkg)
    assert code == 1 and "model.onnx" in one_sentence(err)


def test_usage_errors_exit_2(tmp_path, capsys):
    code, _, err = run(capsys, tmp_path / "missing")
    assert code == 2 and "is not a package folder" in one_sentence(err)
    code, _, err = run(capsys, tmp_path, prompt="caf\udce9")  # what Python makes of argv bytes that are not UTF-8
    assert code == 2 and "not valid UTF-8" in one_sentence(err)


def test_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "Exit codes:" in out and "0  answered" in out and "1  the package cannot be run" in out and "2  usage error" in out
