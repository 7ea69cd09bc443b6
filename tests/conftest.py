"""Every fixture the tests share lives in tests/shared_fixtures.py (not "fixtures": pytest's own plugin
has that name). tests/ is on the import path through pyproject.toml's [tool.pytest.ini_options]
pythonpath, so tests import factory, helpers and shared_fixtures by name."""

import os
import stat
from pathlib import Path

import pytest

import tiers

pytest_plugins = ["shared_fixtures"]
os.environ.pop("FORCE_COLOR", None)  # a CI's FORCE_COLOR would colour the reports the tests read (tests/test_pipeline/test_color.py sets it)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    tiers.mark(items)  # builds / ray / browser, before -m deselects (tests/tiers.py)
    _xdist_groups(config, items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with tiers.guarded(item):  # the quick tier's tests under its guard in every run (tests/tiers.py)
        yield


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    """Before tmp_path's own teardown removes a passing test's folder (pyproject.toml:
    tmp_path_retention_policy = "failed"), its read-only folders (sealed cache entries, read-only
    packages) are made writable: pytest's removal skips what it cannot delete, and kept gigabytes."""
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    if isinstance(tmp, Path):
        writable(tmp)
    yield


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    """The same for the run's whole temp folder (the session fixtures' builds), which pytest removes
    after a run that passed."""
    base = getattr(getattr(session.config, "_tmp_path_factory", None), "_basetemp", None)
    if exitstatus == 0 and base is not None:
        writable(Path(base))


def writable(root: Path) -> None:
    """Give the owner read, write and search permission on every folder under `root`, each before it is
    listed (symlinks not followed)."""
    stack = [str(root)]
    while stack:
        folder = stack.pop()
        try:
            mode = os.lstat(folder).st_mode
            if not stat.S_ISDIR(mode):
                continue
            if mode & 0o700 != 0o700:
                os.chmod(folder, stat.S_IMODE(mode) | 0o700)
            with os.scandir(folder) as entries:
                stack.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
        except OSError:
            continue


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
