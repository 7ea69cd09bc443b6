"""An eval task folder is data (issue 24): the red-team's attacks on `raipack eval --include-path`, each
written as the issue writes it, and the bounds of the folder reader, the template renderer and the loader.

Every attack has a marker: Python in the task folder that writes a file when imported. The marker never
appears, the exit is 2 with one sentence naming the file and the field, and nothing is written. The
checks run before any model loads, so most cases cost the folder read only; the target is the shared
reference package (tests/factory.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from pathlib import Path

import pytest

from factory import reference_package

pytest.importorskip("lm_eval", reason="lm-eval (raipack's eval extra) is not installed")

DOCS = [{"question": "Paris is the capital of", "choices": [" France", " Spain"], "label": 0},
        {"question": "Madrid is the capital of", "choices": [" France", " Spain"], "label": 1}]
CAPITALS = ("task: capitals\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: capitals.jsonl\ntest_split: test\n"
            "output_type: multiple_choice\ndoc_to_text: \"{{question}}\"\ndoc_to_choice: \"{{choices}}\"\ndoc_to_target: label\n"
            "metric_list:\n  - metric: acc\n")


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def package():
    return reference_package("reference-4K")


def marker_code(marker: Path) -> str:
    return f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\ndef process_docs(ds):\n    return ds\n"


def capitals(folder: Path, yaml_text: str = CAPITALS) -> Path:
    """A working task folder: capitals.yaml + capitals.jsonl."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "capitals.yaml").write_text(yaml_text)
    (folder / "capitals.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    return folder


def cli(*args):
    from raipack.cli import main

    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as done, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        main(["eval", *map(str, args)])
    return done.value.code, out.getvalue(), err.getvalue()


def refused(package, folder: Path, tmp_path: Path, expect: str, task: str = "capitals") -> str:
    out = tmp_path / "eval.json"
    code, stdout, stderr = cli(package, "--tasks", task, "--include-path", folder, "-o", out)
    assert code == 2, stderr
    assert expect in stderr, stderr
    assert stderr.count("ERROR:") == 1 and "Traceback" not in stderr and stdout == ""
    assert not out.exists()
    return stderr


# --- the three high eval items, exactly as issue 24 writes them ---------------------------------------

def test_include_of_a_file_not_named_yaml_runs_no_python(package, tmp_path):
    """capitals.yaml + capitals.jsonl, utils.py writing a marker at import, base.txt =
    `process_docs: !function utils.process_docs`, `include: base.txt` added to capitals.yaml."""
    marker = tmp_path / "MARKER"
    folder = capitals(tmp_path / "tasks", "include: base.txt\n" + CAPITALS)
    (folder / "utils.py").write_text(marker_code(marker))
    (folder / "base.txt").write_text("process_docs: !function utils.process_docs\n")
    stderr = refused(package, folder, tmp_path, "base.txt, line 1: the tag !function is not allowed in a task file")
    assert "<unicode string>" not in stderr  # the low item: the refusal names the file
    assert not marker.exists()


def test_yaml_in_a_symlinked_sub_folder_is_checked_not_run(package, tmp_path):
    """`ln -s OTHER_DIR DIR/sub` with a `!function` task in OTHER_DIR."""
    marker = tmp_path / "MARKER"
    folder = capitals(tmp_path / "tasks")
    other = tmp_path / "other"
    other.mkdir()
    (other / "utils.py").write_text(marker_code(marker))
    (other / "evil.yaml").write_text(CAPITALS.replace("task: capitals", "task: evil") + "process_docs: !function utils.process_docs\n")
    (folder / "sub").symlink_to(other)
    refused(package, folder, tmp_path, "sub leads outside the task folder")
    assert not marker.exists()


def test_a_symlinked_sub_folder_inside_the_folder_is_read_and_checked(package, tmp_path):
    """A link that stays inside is followed: its YAML is checked like any other (here: refused for its tag)."""
    marker = tmp_path / "MARKER"
    folder = capitals(tmp_path / "tasks")
    (folder / "real").mkdir()
    (folder / "real" / "utils.py").write_text(marker_code(marker))
    (folder / "real" / "evil.yml").write_text("task: evil\nprocess_docs: !function utils.process_docs\n")
    (folder / "sub").symlink_to(folder / "real")
    refused(package, folder, tmp_path, "evil.yml, line 2: the tag !function is not allowed")
    assert not marker.exists()


def refused_with_script(package, tmp_path: Path, old: str, new: str, script: str, expect: str) -> None:
    """capitals.yaml with `old` made `new`, naming the sub-folder of `script` (which writes a marker
    when imported): refused with `expect`, and the script never ran."""
    marker = tmp_path / "MARKER"
    folder = capitals(tmp_path / "tasks", CAPITALS.replace(old, new))
    (folder / script).parent.mkdir()
    (folder / script).write_text(marker_code(marker))
    refused(package, folder, tmp_path, expect)
    assert not marker.exists()


def test_a_metric_named_by_a_local_path_runs_no_script(package, tmp_path):
    """`metric: ./evm` made lm-eval fall back to evaluate.load("./evm"), which imports evm/evm.py."""
    refused_with_script(package, tmp_path, "metric: acc", "metric: ./evm", "evm/evm.py",
                        "metric_list[0].metric './evm' is not one of lm-eval's built-in metrics")


def test_the_gate_and_the_chain_use_the_same_folder_check(tmp_path):
    """`--chain` and the recipe's [eval] gate go through chain.preflight / run.check_request."""
    from raipack.core.errors import UsageError
    from raipack.evaluation.chain import preflight
    from raipack.evaluation.run import Request

    marker = tmp_path / "MARKER"
    folder = capitals(tmp_path / "tasks", CAPITALS.replace("metric: acc", "metric: ./evm"))
    (folder / "evm").mkdir()
    (folder / "evm" / "evm.py").write_text(marker_code(marker))
    with pytest.raises(UsageError, match=r"metric './evm' is not one of lm-eval's built-in metrics"):
        preflight(Request(["capitals"], include_path=folder))
    assert not marker.exists()


# --- what lm-eval gets: the folder raipack wrote -------------------------------------------------------

def test_a_working_folder_with_an_include_and_an_inner_link_runs_from_raipacks_own_copy(package, tmp_path, monkeypatch):
    """include: of a plain-data .txt base resolved by raipack, a link inside the folder followed, a stray .py
    never copied: lm-eval reads only the folder raipack wrote."""
    from raipack.evaluation import tasks as local_tasks

    folder = tmp_path / "tasks"
    folder.mkdir()
    base, head = CAPITALS.split("output_type")
    (folder / "base.txt").write_text(base)
    (folder / "data").mkdir()
    (folder / "data" / "capitals.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (folder / "capitals.jsonl").symlink_to(folder / "data" / "capitals.jsonl")
    (folder / "capitals.yaml").write_text("include: base.txt\noutput_type" + head)
    (folder / "utils.py").write_text("raise SystemExit('imported')\n")
    seen = {}
    real_workspace = local_tasks.workspace

    @contextlib.contextmanager
    def spy(include):
        with real_workspace(include) as (root, copy):
            seen["files"] = sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file())
            seen["yaml"] = (copy / "capitals.yaml").read_text()
            yield root, copy

    monkeypatch.setattr(local_tasks, "workspace", spy)
    out = tmp_path / "eval.json"
    code, stdout, stderr = cli(package, "--tasks", "capitals", "--include-path", folder, "--numerics", "float", "-o", out)  # BFP16 is not under test
    assert code == 0, stderr
    assert json.loads(out.read_text())["results"]["capitals"]["acc,none"] in (0.0, 0.5, 1.0)
    assert seen["files"] == ["capitals.yaml", "data/data/capitals.jsonl"]  # no utils.py, no base.txt: data under data/
    assert "include" not in seen["yaml"] and "dataset_path: json" in seen["yaml"]


# --- bounds: aliases, depth, templates, special files --------------------------------------------------

def test_an_alias_bomb_in_metadata_is_refused_in_a_second(package, tmp_path):
    """A 1 KB file took 148 s and 6.3 GB: nine levels of nine aliases each."""
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    text = CAPITALS + "metadata:\n" + "".join(f"  {line}\n" for line in levels)
    assert len(text) < 1200
    folder = capitals(tmp_path / "tasks", text)
    t0 = time.monotonic()
    refused(package, folder, tmp_path, "aliases")
    assert time.monotonic() - t0 < 20


def test_deep_yaml_is_one_sentence(package, tmp_path):
    folder = capitals(tmp_path / "tasks", CAPITALS + "metadata:\n  deep: " + "[" * 20000 + "]" * 20000 + "\n")
    refused(package, folder, tmp_path, "nests deeper than")


def test_a_nested_range_template_is_stopped(package, tmp_path):
    """`range(100000)` inside `range(100000)`: the sandbox capped each range, not the nesting."""
    loop = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{question}}"
    folder = capitals(tmp_path / "tasks", CAPITALS.replace('doc_to_text: "{{question}}"', f"doc_to_text: \"{loop}\""))
    t0 = time.monotonic()
    refused(package, folder, tmp_path, "a template needs more than")
    assert time.monotonic() - t0 < 60


def test_a_fifo_in_the_task_folder_is_one_sentence(package, tmp_path):
    folder = capitals(tmp_path / "tasks")
    os.mkfifo(folder / "pipe.yaml")
    refused(package, folder, tmp_path, "pipe.yaml is not a plain file or folder")


@pytest.mark.parametrize("change, expect", [
    ("bogus_key: 1\n", "the key 'bogus_key' is not one of lm-eval's task keys"),  # was a TypeError from TaskConfig
    ("class: !function utils.Task\n", "the tag !function is not allowed"),
    ("custom_dataset: anything\n", "the key 'custom_dataset' names a Python function"),
    ("unsafe_code: true\n", "unsafe_code is set"),
    ("filter_list:\n  - name: f\n    filter:\n      - function: custom\n", "filter_list[0].filter[0].function 'custom' is not one of lm-eval's built-in filters"),
])
def test_keys_that_name_code_or_no_key_of_lm_eval_are_refused(package, tmp_path, change, expect):
    refused(package, capitals(tmp_path / "tasks", CAPITALS + change), tmp_path, expect)


@pytest.mark.parametrize("files", ["../x.jsonl", "['../x.jsonl']", "{test: /etc/hostname}"])
def test_data_files_of_every_shape_stay_inside_the_folder(package, tmp_path, files):
    """`dataset_kwargs.data_files` written as a string escaped the inside-the-folder check."""
    (tmp_path / "x.jsonl").write_text(json.dumps(DOCS[0]) + "\n")
    text = CAPITALS.replace("  data_files:\n    test: capitals.jsonl\n", f"  data_files: {files}\n")
    refused(package, capitals(tmp_path / "tasks", text), tmp_path, "leads outside the task folder")


def test_a_dataset_path_that_is_a_folder_with_a_script_is_refused(package, tmp_path):
    refused_with_script(package, tmp_path, "dataset_path: json", "dataset_path: ./ds", "ds/ds.py", "dataset_path is './ds'; expected one of json")


def test_the_loader_child_has_no_network_and_reports_its_failure(tmp_path):
    """lm-eval's loading runs in a child; a failure there is one sentence here, not a traceback."""
    from raipack.core.errors import UsageError
    from raipack.evaluation import loadcheck

    folder = capitals(tmp_path / "tasks")
    (folder / "capitals.jsonl").write_text("not json\n")
    with pytest.raises(UsageError, match=r"lm-eval cannot load tasks capitals of the task folder: "):
        loadcheck.check(folder, ["capitals"], tmp_path / "log.txt")
    import socket

    saved = socket.socket.connect, socket.create_connection, socket.getaddrinfo
    try:
        loadcheck._no_network()
        with pytest.raises(OSError, match="no network"):
            socket.create_connection(("127.0.0.1", 9))
    finally:
        socket.socket.connect, socket.create_connection, socket.getaddrinfo = saved
