"""`make test` holds the quick tier's tests to the quick tier's guard (issue 40): `make check` failed on main
with 9 tests of the fake builds the evidence missed, and nothing in `make test` noticed."""

import os

import pytest

import tiers
from test_tiers import BUILDER, Item  # a module constant: a builder named in this test's code would mark it


class Marked(Item):
    def __init__(self, function, *markers):
        super().__init__(function)
        for name in markers:
            self.add_marker(name)

    def get_closest_marker(self, name):
        return name if name in self.markers else None


def _uses_a_fake_build(env):
    """tests/test_pipeline/test_cache_*.py's shape: a fixture of tests/helpers.py's fake builds."""
    from helpers import run_fake_build

    return run_fake_build()


def test_this_quick_test_runs_under_the_guard_in_every_run():
    """In `make test` too, not only `make check`: a builder called here would fail the test."""
    assert os.environ.get(tiers.TIER_ENV) == "check"
    with pytest.raises(pytest.fail.Exception, match="mark it @pytest.mark.builds"):
        tiers.refuse_in_quick_tier(BUILDER)


def test_the_guard_is_on_for_the_quick_tier_only_and_then_off(monkeypatch):
    monkeypatch.delenv(tiers.TIER_ENV, raising=False)
    quick, builds = Marked(_uses_a_fake_build), Marked(_uses_a_fake_build, "builds")
    with tiers.guarded(quick):
        assert os.environ.get(tiers.TIER_ENV) == "check"
    assert tiers.TIER_ENV not in os.environ
    with tiers.guarded(builds):
        assert tiers.TIER_ENV not in os.environ
    monkeypatch.setenv(tiers.TIER_ENV, "something else")  # a run that chose its tier keeps it
    with tiers.guarded(quick):
        assert os.environ[tiers.TIER_ENV] == "something else"
    assert os.environ[tiers.TIER_ENV] == "something else"


def test_a_fake_build_marks_builds():
    item = Item(_uses_a_fake_build)
    tiers.mark([item])
    assert item.markers == ["builds"]


def test_the_quick_expression_excludes_exactly_the_cost_markers():
    assert tiers.QUICK == "not (slow or seeds or fuzz or builds or ray or browser)"
    makefile = (tiers.__file__.rsplit("/tests/", 1)[0] + "/Makefile")
    assert f"QUICK := {tiers.QUICK}\n" in open(makefile).read()
