"""The command line as CI uses it: exit codes, report formats, atomic output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from xml.etree import ElementTree as ET

import pytest

from helpers import edit_json, run_cli, ryzen
from raipack.core import schemas

P16 = "1.8.0-npu-16K"


run = run_cli  # tests/helpers.py


def broken(make_pkg):
    pkg = make_pkg(P16)
    edit_json(pkg / "genai_config.json", lambda d: ryzen(d).__setitem__("hybrid_opt_token_backend", "cpu"))
    return pkg


def test_exit_codes(make_pkg, capsys, tmp_path):
    assert run(capsys, "validate", make_pkg(P16))[0] == 0
    assert run(capsys, "validate", broken(make_pkg))[0] == 1
    assert run(capsys, "validate", tmp_path / "missing")[0] == 2
    assert run(capsys, "validate", "--format", "yaml", make_pkg(P16))[0] == 2
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "validate", tmp_path / "empty")
    assert code == 3 and err.startswith("ERROR: ") and "hint:" in err


def test_strict_turns_warnings_into_failures(make_pkg, capsys):
    pkg = make_pkg(P16)
    (pkg / "notes.py").write_text("print('hi')\n")  # RP106 warning
    assert run(capsys, "validate", pkg)[0] == 0
    assert run(capsys, "validate", "--strict", pkg)[0] == 1
    assert run(capsys, "validate", "--strict", "--ignore", "RP106", pkg)[0] == 0


def test_select_limits_the_checks(make_pkg, capsys):
    code, out, _ = run(capsys, "validate", "--format", "json", "--select", "RP4", broken(make_pkg))
    report = json.loads(out)
    assert code == 1
    assert report["results"][0]["checks_run"] == ["RP401", "RP402", "RP403", "RP404", "RP405", "RP406", "RP407"]


def test_text_report_groups_by_file_and_ends_with_a_verdict(make_pkg, capsys):
    code, out, _ = run(capsys, "validate", broken(make_pkg))
    lines = out.splitlines()
    assert "profile 1.8.0-npu-16K" in lines[0]
    assert "  genai_config.json" in lines
    assert any("RP403" in line and "'cpu'" in line for line in lines)
    assert lines[-1].strip().startswith("FAIL:")


def test_json_report_matches_its_schema(make_pkg, capsys):
    code, out, _ = run(capsys, "validate", "--format", "json", broken(make_pkg), make_pkg(P16))
    report = json.loads(out)
    assert schemas.errors("report", report) == []
    assert report["exit_code"] == code == 1
    assert [r["counts"]["error"] > 0 for r in report["results"]] == [True, False]


def test_junit_report(make_pkg, capsys, tmp_path):
    out_file = tmp_path / "report.xml"
    code, out, _ = run(capsys, "validate", "--format", "junit", "-o", out_file, broken(make_pkg))
    suite = ET.parse(out_file).getroot().find("testsuite")
    failures = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert code == 1 and failures == ["RP403"] and suite.get("failures") == "1"
    assert "FAIL:" in out  # the text summary still goes to the console
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_sarif_report(make_pkg, capsys):
    _, out, _ = run(capsys, "validate", "--format", "sarif", broken(make_pkg))
    sarif = json.loads(out)
    results = sarif["runs"][0]["results"]
    assert sarif["version"] == "2.1.0"
    assert [(r["ruleId"], r["level"]) for r in results] == [("RP403", "error")]
    assert {r["id"] for r in sarif["runs"][0]["tool"]["driver"]["rules"]} >= {"RP101", "RP403", "RP802"}


def test_output_to_unwritable_place_is_one_sentence(make_pkg, capsys, tmp_path):
    code, _, err = run(capsys, "validate", "--format", "json", "-o", tmp_path / "no" / "such" / "dir" / "r.json", make_pkg(P16))
    assert code == 1 and err.startswith("ERROR: cannot write") and "Traceback" not in err


def test_checks_schemas_profiles_commands(capsys):
    code, out, _ = run(capsys, "checks")
    assert code == 0 and out.count("\nRP") + 1 >= 27 and "RP802 content-hash" in out
    code, out, _ = run(capsys, "schemas", "genai_config")
    assert code == 0 and json.loads(out)["$schema"].endswith("2020-12/schema")
    code, out, _ = run(capsys, "schemas")
    assert code == 0 and "manifest" in out
    assert run(capsys, "schemas", "nope")[0] == 2
    code, out, _ = run(capsys, "profiles")
    assert code == 0 and "1.8.0-npu-16K" in out


def test_inspect_summarises(make_pkg, capsys):
    code, out, _ = run(capsys, "inspect", "--json", make_pkg(P16))
    data = json.loads(out)
    assert code == 0
    assert data["profile"] == P16
    assert data["quantization"]["group_size"] == 128
    assert data["provider_options"]["hybrid_opt_token_backend"] == "npu"
    assert data["lengths"]["max_length"] == 16384
    assert "NPU" in data["runs_on"]
    code, out, _ = run(capsys, "inspect", make_pkg(P16))
    assert code == 0 and "profile   1.8.0-npu-16K" in out


def test_validate_never_imports_build_dependencies(make_pkg):
    """The light base: validate must not import torch, transformers or onnxruntime."""
    pkg = make_pkg(P16)
    code = ("import sys; from raipack.cli import main\n"
            "try:\n    main(['validate', '--verify-hashes', sys.argv[1]])\nexcept SystemExit as e:\n    code = e.code\n"
            "heavy = [m for m in ('torch', 'transformers', 'onnxruntime', 'onnxruntime_genai', 'quark') if m in sys.modules]\n"
            "print('HEAVY', heavy); sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", code, str(pkg)], capture_output=True, text=True)
    assert "HEAVY []" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 0


@pytest.mark.skipif(not os.environ.get("RAIPACK_LIGHT_PYTHON"), reason="RAIPACK_LIGHT_PYTHON not set (make test sets it to the light-base venv)")
def test_light_install_validates(make_pkg):
    """`pip install raipack` (no build extra) is enough for validate, as CI users install it."""
    light = os.environ["RAIPACK_LIGHT_PYTHON"]
    pkg = make_pkg(P16)
    proc = subprocess.run([light, "-m", "raipack.cli", "validate", "--format", "junit", str(pkg)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "<testsuites" in proc.stdout
    missing = subprocess.run([light, "-c", "import torch"], capture_output=True)
    assert missing.returncode != 0, "the light venv must not have torch"
