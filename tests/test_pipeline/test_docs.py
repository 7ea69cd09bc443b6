"""Generated docs stay in step with the code and data they describe."""

from pathlib import Path

import tomllib

from pipeline import docgen

ROOT = Path(__file__).resolve().parents[2]


def test_checks_and_profiles_docs_are_current():
    assert (ROOT / "docs" / "checks.md").read_text() == docgen.checks_md(), "run: python -m pipeline.docgen"
    assert (ROOT / "docs" / "profiles.md").read_text() == docgen.profiles_md(), "run: python -m pipeline.docgen"


def test_every_python_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {p.parent.relative_to(ROOT).as_posix().replace("/", ".") for top in ("pipeline", "stages") for p in (ROOT / top).rglob("__init__.py")}
    assert found <= listed, f"add to pyproject.toml [tool.setuptools] packages: {sorted(found - listed)}"


def test_validate_accepts_a_genai_config_path(make_pkg):
    from pipeline.validate import validate

    pkg = make_pkg("1.8.0-npu-16K")
    assert validate(pkg / "genai_config.json").root == str(pkg)
