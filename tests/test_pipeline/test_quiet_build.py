"""The build prints raipack's own lines only; what libraries say goes to the stage's log.txt."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from raipack.builder import logs
from raipack.builder.progress import Progress

RAIPACK = str(Path(sys.executable).with_name("raipack"))


def _job(tmp_path: Path, verbose: bool = False):
    work = tmp_path / "cache" / ".staging-x"
    work.mkdir(parents=True)
    terminal = open(2, "w", buffering=1, closefd=False)  # what the CLI's Progress writes to: fd 2
    recipe = SimpleNamespace(output=str(tmp_path / "build"), model_name=lambda: "m")
    return SimpleNamespace(workdir=work, progress=Progress("plain", stream=terminal, verbose=verbose), stage=SimpleNamespace(name="export"),
                           recipe=recipe, profile=SimpleNamespace(id="p", detect=SimpleNamespace(name_patterns=("*_rai",))))


def _talk(job):
    os.write(1, b"C extension on fd 1\n")
    os.write(2, b"C extension on fd 2\n")
    print("a library's print")
    handler = logging.StreamHandler()  # bound to sys.stderr as it is now, like a library configuring its logger
    log = logging.getLogger("some.library")
    log.addHandler(handler)
    try:
        log.warning("[INFO] a library's log line")
    finally:
        log.removeHandler(handler)
    job.progress.line("raipack's own line")


def test_library_output_goes_to_the_stage_log_and_raipack_lines_to_the_terminal(tmp_path, capfd):
    job = _job(tmp_path)
    with logs.captured(job):
        _talk(job)
    out, err = capfd.readouterr()
    text = (job.workdir / logs.LOG_NAME).read_text()
    for said in ("C extension on fd 1", "C extension on fd 2", "a library's print", "[INFO] a library's log line"):
        assert said in text and said not in out + err
    assert "raipack's own line" in err and "raipack's own line" not in text
    job.progress.stage("export", "built", 1.0, "done")
    assert "export    built" in (line := capfd.readouterr().err) and "log: " in line and "export/log.txt" in line


def test_verbose_shows_library_output_live_and_still_logs_it(tmp_path, capfd):
    job = _job(tmp_path, verbose=True)
    with logs.captured(job):
        _talk(job)
    out, err = capfd.readouterr()
    text = (job.workdir / logs.LOG_NAME).read_text()
    assert "C extension on fd 1" in text and "C extension on fd 1" in err
    assert "[INFO] a library's log line" in text and "[INFO] a library's log line" in err


def test_nothing_said_no_log_and_a_failed_stage_keeps_its_log_outside_the_cache(tmp_path, capfd):
    job = _job(tmp_path)
    with logs.captured(job):
        job.progress.line("only raipack")
    assert not (job.workdir / logs.LOG_NAME).exists()
    with pytest.raises(RuntimeError), logs.captured(job):
        os.write(2, b"the library's last words\n")
        raise RuntimeError("boom")
    kept = tmp_path / "build" / "m_rai.stages" / "export.log.txt"
    assert "the library's last words" in kept.read_text()
    assert "export.log.txt" in capfd.readouterr().err


@pytest.fixture(scope="session")
def built_to_export(tmp_path_factory):
    """A tiny model whose width 128 does not divide (group size auto → 64, with a warning),
    built through quantize and export by the CLI in a subprocess."""
    from shared_fixtures import make_tiny_llama

    root = tmp_path_factory.mktemp("quiet-build")
    model = make_tiny_llama(root / "model", hidden=192, intermediate=384)
    recipe = root / "recipe.toml"
    recipe.write_text("[quantize]\nquality = false\n")  # no perplexity runs: seconds saved, nothing printed less
    env = dict(os.environ, RAIPACK_CACHE=str(root / "cache"), NO_COLOR="1")
    proc = subprocess.run([RAIPACK, "build", str(model), "--recipe", str(recipe), "--algorithm", "rtn", "--until", "export", "--output", str(root / "build")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc, root / "build" / "model_rai_1.8.0_npu_16K.stages"


def test_build_prints_its_own_lines_only(built_to_export):
    proc, _ = built_to_export
    printed = proc.stdout + proc.stderr
    assert "[INFO]" not in printed and "Warning:" not in printed and "UserWarning" not in printed
    assert ".staging-" not in printed and "Saving" not in printed
    assert len(printed.splitlines()) <= 12, printed
    warning = [line for line in printed.splitlines() if "group size 128 does not divide" in line]
    assert len(warning) == 1 and warning[0].strip().startswith("warning: ") and "using group size 64" in warning[0]
    export_line = next(line for line in printed.splitlines() if "export" in line and "built" in line)
    assert "log: build/model_rai_1.8.0_npu_16K.stages/export/log.txt" in export_line  # relative to the working folder


def test_the_stage_log_holds_the_library_lines_and_is_part_of_the_output(built_to_export):
    proc, stages = built_to_export
    text = (stages / "export" / logs.LOG_NAME).read_text()
    # the model builder's own prints (its int4 pass, whose onnxruntime.quantization [INFO] lines this test once
    # read, is skipped when Quark has quantized the linears): in the log, not on the terminal
    said = "GroupQueryAttention (GQA) is used"
    assert said in text and said not in proc.stdout + proc.stderr
    files = {f["path"]: f for f in json.loads((stages / "export" / "manifest.json").read_text())["files"]}
    assert files[logs.LOG_NAME]["role"] == "log"
    assert not (stages / "quantize" / logs.LOG_NAME).exists() or "group size 128" not in (stages / "quantize" / logs.LOG_NAME).read_text()
