"""The layers and the style rules, checked on every `make test`.

- import-linter's contracts (pyproject.toml [tool.importlinter]) are all kept, and each of them bites: a
  copy of pipeline/ and stages/ with one deliberately broken import per contract fails, naming it;
- ruff (pyproject.toml [tool.ruff]) finds nothing, sees every tracked *.py, and its limits bite;
- pyproject.toml's hand-written package list is exactly the folders that have an __init__.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CONTRACTS = PYPROJECT["tool"]["importlinter"]["contracts"]
WIDE = {**os.environ, "COLUMNS": "1000", "NO_COLOR": "1", "TERM": "dumb"}  # one contract, one line


def lint_imports(folder: Path) -> subprocess.CompletedProcess:
    """lint-imports run on the `raipack` package laid out from `folder`'s pipeline/ and stages/ (see
    tests/import_view.py: import-linter walks one folder per root package); no cache written."""
    return subprocess.run([sys.executable, str(HERE / "import_view.py"), str(folder)], env=WIDE,
                          capture_output=True, text=True, timeout=120)


def broken_section(output: str, name: str) -> str:
    """The part of lint-imports' "Broken contracts" listing under contract `name` ("" if it is not there)."""
    _, _, broken = output.partition("Broken contracts")
    names = [c["name"] for c in CONTRACTS]
    lines = broken.splitlines()
    if name not in lines:
        return ""
    start = lines.index(name) + 1
    end = next((i for i in range(start, len(lines)) if lines[i] in names), len(lines))
    return "\n".join(lines[start:end])


# ------------------------------------------------------------------------------ import-linter


def test_every_layer_contract_is_kept():
    proc = lint_imports(REPO)
    assert proc.returncode == 0, f"lint-imports found a broken layer contract:\n{proc.stdout[proc.stdout.find('Contracts'):]}{proc.stderr}"
    for contract in CONTRACTS:
        assert f"{contract['name']} KEPT" in proc.stdout


def _first(entry: str) -> str:
    """The first module of a layer entry ("a : b" siblings, "a | b" independent siblings)."""
    return entry.replace("|", ":").split(":")[0].strip()


def _breaking_import(contract: dict) -> tuple[str, str]:
    """(importer, imported): one import that contract forbids."""
    kind = contract["type"]
    if kind == "layers":
        return _first(contract["layers"][-1]), _first(contract["layers"][0])  # the foundation imports the top
    if kind == "independence":
        return contract["modules"][0], contract["modules"][1]
    if kind == "forbidden":
        return contract["source_modules"][0], contract["forbidden_modules"][0]
    pytest.fail(f"contract {contract['name']!r} is of type {kind!r}: add the import that breaks it to _breaking_import")


def _source_file(folders: dict[str, Path], module: str) -> Path:
    """The file of `module` in the repo's layout (`folders`: package name -> its folder, longest first wins)."""
    top = max((name for name in folders if module == name or module.startswith(name + ".")), key=len)
    path = folders[top].joinpath(*module[len(top):].lstrip(".").split(".")) if module != top else folders[top]
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def test_every_contract_bites(tmp_path):
    """A copy of the code with one import per contract that breaks it: lint-imports fails and names that
    contract and that import (at the line it was added on)."""
    for name in ("pipeline", "stages"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    folders = {"raipack": tmp_path / "pipeline", "raipack.stages": tmp_path / "stages"}
    added = {}
    for contract in CONTRACTS:
        importer, imported = _breaking_import(contract)
        source = _source_file(folders, importer)
        text = source.read_text()
        text += ("" if text.endswith("\n") or not text else "\n") + f"import {imported}\n"
        source.write_text(text)
        added[contract["name"]] = f"{importer} -> {imported} (l.{text.count(chr(10))})"

    proc = lint_imports(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for name, line in added.items():
        assert f"{name} BROKEN" in proc.stdout, proc.stdout
        assert line in broken_section(proc.stdout, name), f"{name!r} does not name {line}:\n{proc.stdout}"


# ------------------------------------------------------------------------------ ruff


def ruff(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *args],
                          cwd=cwd, env=WIDE, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing():
    assert "ruff" in PYPROJECT["tool"], "pyproject.toml has no [tool.ruff] configuration"
    proc = ruff()
    assert proc.returncode == 0, f"ruff check:\n{proc.stdout[-6000:]}{proc.stderr[-2000:]}"


LINTED = ("pipeline", "stages", "bench", "tests")  # the folders whose every tracked *.py the gate must see


def unlinted(*args: str) -> list[str]:
    """The tracked *.py files under LINTED that `ruff check --show-files` (with `args`) leaves out."""
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--", *(f"{d}/*.py" for d in LINTED)],
                             capture_output=True, text=True, timeout=60)
    if tracked.returncode != 0:
        pytest.skip(f"not a git checkout, so the tracked files are unknown: {tracked.stderr.strip()}")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--show-files", *args],
                          cwd=REPO, env=WIDE, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    shown = {Path(line).resolve().relative_to(REPO).as_posix() for line in proc.stdout.splitlines() if line.strip()}
    return sorted(f for f in tracked.stdout.split("\0") if f and f not in shown)


def test_ruff_sees_every_tracked_python_file():
    """The gate lints all of pipeline/, stages/, bench/ and tests/: a bare name in an exclude (ruff matches
    it at any depth) once hid all of pipeline/build/."""
    assert unlinted() == [], "ruff check skips these tracked files: anchor the excludes in pyproject.toml [tool.ruff] to the root"


@pytest.mark.parametrize("exclude", ["pipeline/builder", "builder"])
def test_the_coverage_check_catches_an_excluded_folder(exclude):
    """A folder dropped from the gate (anchored, or by a bare name that matches at any depth) is reported."""
    missing = unlinted("--extend-exclude", exclude)
    builder = subprocess.run(["git", "-C", str(REPO), "ls-files", "--", "pipeline/builder/*.py"], capture_output=True, text=True).stdout.split()
    assert builder and set(builder) <= set(missing), missing


@pytest.mark.parametrize("rule, source", [
    ("PLR0915", "def long():\n" + "".join(f"    x{i} = {i}\n" for i in range(80)) + "    return x0\n"),  # 80 statements
    ("PLR0913", "def wide(a, b, c, d, e, f, g):\n    return a\n"),  # 7 parameters: they belong in a typed object
    ("RUF100", "x = 1  # noqa: E501\n"),  # a noqa for nothing hides the next real finding
])
def test_ruff_limits_bite(tmp_path, rule, source):
    """Each configured limit fails the gate on a file that breaks it."""
    (tmp_path / "bad.py").write_text(source)
    proc = ruff("--config", str(REPO / "pyproject.toml"), str(tmp_path / "bad.py"), cwd=tmp_path)
    assert proc.returncode == 1 and rule in proc.stdout, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------ packaging


def test_package_list_matches_the_folders():
    """setuptools ships exactly pyproject's list: a folder of modules left off it would be missing from
    an installed raipack; a listed one that is gone breaks the install. Every folder is named by the
    package-dir mapping (pipeline/ is raipack, stages/ is raipack.stages, schemas/ is raipack.schemas)."""
    setup = PYPROJECT["tool"]["setuptools"]
    folders = {name: REPO / path for name, path in setup.get("package-dir", {}).items()}
    assert set(folders) == {"raipack", "raipack.stages", "raipack.schemas"}, folders
    found = set()
    for name, path in folders.items():
        assert (path / "__init__.py").is_file(), f"{name} ({path}) has no __init__.py"
        for init in path.rglob("__init__.py"):
            found.add(".".join((name, *init.parent.relative_to(path).parts)))
    missing_init = sorted(str(d.relative_to(REPO)) for top in ("pipeline", "stages") for d in (REPO / top).rglob("*")
                          if d.is_dir() and "__pycache__" not in d.parts and any(d.glob("*.py")) and not (d / "__init__.py").exists())
    assert missing_init == [], f"folders of modules without an __init__.py: {missing_init}"
    assert sorted(setup["packages"]) == sorted(found), (
        f"pyproject.toml [tool.setuptools] packages: add {sorted(found - set(setup['packages']))}, "
        f"remove {sorted(set(setup['packages']) - found)}")
