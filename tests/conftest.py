"""Every fixture the tests share lives in tests/shared_fixtures.py (not "fixtures": pytest's own plugin
has that name). tests/ is on the import path through pyproject.toml's [tool.pytest.ini_options]
pythonpath, so tests import factory, helpers and shared_fixtures by name."""

pytest_plugins = ["shared_fixtures"]
