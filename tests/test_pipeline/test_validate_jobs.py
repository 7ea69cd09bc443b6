"""`raipack validate` over a zoo (a folder of package folders): one report for all, the worst exit
code, the same verdict serial, in a process pool (`--jobs`) and through any executor; ray is never
imported unless `--executor ray`. The Ray executor itself runs in test_ray_cluster.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from factory import make_package
from helpers import edit_json, run_cli, ryzen
from raipack.validate import expand, validate_all

P16 = "1.8.0-npu-16K"
P4 = "1.8.0-npu-4K"


run = run_cli  # tests/helpers.py


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> Path:
    """Three packages (one broken), a folder with no package, a hidden folder and a loose file."""
    root = tmp_path_factory.mktemp("zoo")
    for name, profile in (("a_16K", P16), ("b_4K", P4), ("c_broken", P16)):
        make_package(root, profile, name=name)
    edit_json(root / "c_broken" / "genai_config.json", lambda d: ryzen(d).__setitem__("hybrid_opt_token_backend", "cpu"))
    (root / "notes").mkdir()
    (root / "notes" / "todo.txt").write_text("nothing here\n")
    shutil.copytree(root / "a_16K", root / ".trash")
    (root / "README.md").write_text("our zoo\n")
    return root


def roots(report: str) -> list[str]:
    return [Path(r["root"]).name for r in json.loads(report)["results"]]


def test_a_zoo_is_its_packages_in_one_report(zoo, capsys):
    code, out, _ = run(capsys, "validate", "--format", "json", zoo)
    assert roots(out) == ["a_16K", "b_4K", "c_broken"]  # not notes/, not .trash/
    assert code == 1  # the worst of all: c_broken has an error
    bad = {Path(r["root"]).name: r["counts"]["error"] for r in json.loads(out)["results"]}
    assert bad["c_broken"] > 0 and bad["a_16K"] == bad["b_4K"] == 0


def test_jobs_gives_the_serial_verdict(zoo, capsys):
    serial = json.loads(run(capsys, "validate", "--format", "json", zoo)[1])
    code, out, _ = run(capsys, "validate", "--format", "json", "--jobs", "2", zoo)
    pooled = json.loads(out)
    assert code == 1
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in serial["results"]]
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in pooled["results"]] == strip


def test_worst_exit_code_over_paths(zoo, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert run(capsys, "validate", zoo / "a_16K", zoo / "b_4K")[0] == 0
    code, out, err = run(capsys, "validate", "-j", "2", zoo / "a_16K", tmp_path / "empty")
    assert code == 3 and "holds no model package" in err and "a_16K" in out
    assert run(capsys, "validate", "-j", "2", tmp_path / "empty", zoo)[0] == 1
    assert run(capsys, "validate", "-j", "2", zoo / "a_16K", tmp_path / "missing")[0] == 2


def test_junit_has_one_suite_per_package(zoo, capsys, tmp_path):
    report = tmp_path / "r.xml"
    code, _, _ = run(capsys, "validate", "--format", "junit", "-o", report, "-j", "2", zoo)
    text = report.read_text()
    assert code == 1 and all(name in text for name in ("a_16K", "b_4K", "c_broken"))


def test_what_is_not_a_zoo(zoo, tmp_path):
    assert expand([zoo / "a_16K"]) == [zoo / "a_16K"]  # a package is itself
    holder = tmp_path / "holder"
    shutil.copytree(zoo / "a_16K", holder / "inner")
    (holder / "manifest.json").write_text("{}")  # a folder with its own manifest (a model package) is not a zoo
    assert expand([holder]) == [holder]
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "pkg").symlink_to(zoo / "a_16K")
    assert expand([tmp_path / "linked"]) == [tmp_path / "linked"]  # links are not followed into a zoo


def test_any_executor_runs_the_validations(zoo):
    """The executor protocol (submit/wait/result), as RayExecutor implements it: one task per
    package, one CPU each, outcomes in order; a folder's user error comes back as its outcome."""
    class Inline:
        def __init__(self):
            self.asked = []

        def submit(self, fn, arg, resources):
            self.asked.append((arg["path"], resources))
            return fn(arg)

        def wait(self, handles, timeout):
            return handles[:1], handles[1:]

        def result(self, handle):
            return handle

    ex = Inline()
    outcomes = validate_all([zoo, zoo.parent / "no-such-folder"], executor=ex)
    assert [Path(p).name for p, _ in ex.asked] == ["a_16K", "b_4K", "c_broken", "no-such-folder"]
    assert all(r == {"num_cpus": 1} for _, r in ex.asked)
    assert [o.failed() for o in outcomes[:3]] == [False, False, True]
    assert "does not exist" in str(outcomes[3]) and outcomes[3].exit_code == 2


def test_ray_is_imported_only_for_executor_ray(zoo, tmp_path):
    """The light install: `--jobs` uses no ray; `--executor ray` without ray is one sentence, exit 2."""
    code = ("import sys\nfrom raipack.cli import main\n"
            "block = sys.argv[1] == 'block'\n"
            "if block: sys.modules['ray'] = None\n"
            "try:\n    main(sys.argv[2:])\n"
            "except SystemExit as e:\n    print('EXIT', e.code, 'ray' in sys.modules and sys.modules['ray'] is not None)\n")
    proc = subprocess.run([sys.executable, "-c", code, "free", "validate", "-j", "2", str(zoo / "a_16K"), str(zoo / "b_4K")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert "EXIT 0 False" in proc.stdout, proc.stdout + proc.stderr
    proc = subprocess.run([sys.executable, "-c", code, "block", "validate", "--executor", "ray", str(zoo / "a_16K")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert "EXIT 2" in proc.stdout and "needs the ray package" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_address_needs_executor_ray(zoo, capsys):
    code, _, err = run(capsys, "validate", "--address", "127.0.0.1:6379", zoo)
    assert code == 2 and "--executor ray" in err
