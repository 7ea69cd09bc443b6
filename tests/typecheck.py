"""Run mypy on the `raipack` package as it installs (pipeline/ is `raipack`), on the packages that
pyproject.toml's [tool.mypy] `packages` lists (pipeline/core/ and pipeline/npu/ at least).

mypy cannot follow the import hook of an editable install, so this lays the package out the way
tests/import_view.py does (pipeline/ as raipack/, stages/ as raipack/stages/, in build/typecheck/,
files' times kept so mypy's cache in build/typecheck-cache/ stays valid) and runs mypy there with
the repo's settings; paths in its output are the repository's again (raipack/ -> pipeline/).
`make check`, `make typecheck` and tests/test_types.py call it.

    python tests/typecheck.py [REPO]      exit code is mypy's
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import tomllib


def main(argv: list[str]) -> int:
    repo = Path(argv[0] if argv else Path(__file__).resolve().parents[1]).resolve()
    view, cache = repo / "build" / "typecheck", repo / "build" / "typecheck-cache"
    shutil.rmtree(view, ignore_errors=True)
    skip = shutil.ignore_patterns("__pycache__", "*.json", "*.txt", "*.j2")
    shutil.copytree(repo / "pipeline", view / "raipack", ignore=skip)
    shutil.copytree(repo / "stages", view / "raipack" / "stages", ignore=skip)
    packages = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["mypy"]["packages"]
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(repo / "pyproject.toml"), "--cache-dir", str(cache)]
    run = subprocess.run([*cmd, *(a for p in packages for a in ("-p", p))], cwd=view, capture_output=True, text=True)
    sys.stdout.write(run.stdout.replace("raipack/", "pipeline/").replace("pipeline/stages/", "stages/"))
    sys.stderr.write(run.stderr)
    return run.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
