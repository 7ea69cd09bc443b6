"""Every fixture the tests share lives in tests/shared_fixtures.py (not "fixtures": pytest's own plugin
has that name). tests/ is on the import path through pyproject.toml's [tool.pytest.ini_options]
pythonpath, so tests import factory, helpers and shared_fixtures by name."""

import pytest

import tiers

pytest_plugins = ["shared_fixtures"]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    tiers.mark(items)  # builds / ray / browser, before -m deselects (tests/tiers.py)
    _xdist_groups(config, items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with tiers.guarded(item):  # the quick tier's tests under its guard in every run (tests/tiers.py)
        yield


def _xdist_groups(config, items):
    """`--dist loadgroup` keeps an `xdist_group` on one worker by suffixing its tests' node ids with
    `@<group>` on the worker. pytest-xdist 3.8 does that by setting `item._nodeid`, which pytest 9
    no longer reads (a node id lives in `item._id`), so every group was spread over both workers and
    each built its family's model and stages again. Until xdist follows, the suffix is set here; a
    pytest that moves it again fails collection instead of silently losing the groups."""
    if not getattr(config.option, "loadgroup", False):
        return
    from _pytest.nodeid import coerce_node_id

    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix):
            item._id = coerce_node_id(item.nodeid + suffix)
            if not item.nodeid.endswith(suffix):
                raise pytest.UsageError(f"cannot set the xdist group of {item.nodeid}: pytest {pytest.__version__} stores node ids elsewhere")
