"""mypy is clean on the packages pyproject.toml's [tool.mypy] lists (pipeline/core/ and
pipeline/npu/ at least), run the way `make check` runs it (tests/typecheck.py)."""

import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_covers_core_and_npu():
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["packages"]
    assert {"raipack.core", "raipack.npu"} <= set(packages)


def test_mypy_is_clean():
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "typecheck.py")], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "Success: no issues found" in run.stdout
