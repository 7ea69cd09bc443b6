"""Run lint-imports on the `raipack` package as it installs: pipeline/ is `raipack`, stages/ is
`raipack.stages` (pyproject.toml [tool.setuptools.package-dir]).

import-linter walks one folder per root package, and stages/ lives beside pipeline/, not in it, so
this lays the package out in a temporary folder (pipeline/ as raipack/, stages/ as raipack/stages/)
and runs lint-imports there with the repo's contracts. `make lint` and tests/test_layers.py call it.

    python tests/import_view.py [REPO]      exit code and output are lint-imports'
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def lay_out(repo: Path, dest: Path) -> Path:
    """dest/raipack from repo/pipeline and repo/stages, .py files only; returns dest."""
    skip = shutil.ignore_patterns("__pycache__", "*.json", "*.txt", "*.j2")
    shutil.copytree(repo / "pipeline", dest / "raipack", ignore=skip)
    shutil.copytree(repo / "stages", dest / "raipack" / "stages", ignore=skip)
    shutil.copy(repo / "pyproject.toml", dest / "pyproject.toml")
    return dest


def main(argv: list[str]) -> int:
    repo = Path(argv[0] if argv else Path(__file__).resolve().parents[1]).resolve()
    lint = Path(sys.executable).with_name("lint-imports")
    with tempfile.TemporaryDirectory(prefix="raipack-imports-") as tmp:
        view = lay_out(repo, Path(tmp))
        return subprocess.run([str(lint), "--no-cache", "--no-logo", "pyproject.toml"], cwd=view).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
