"""The quick tier's markers (tests/tiers.py): evidence found where it is, and the guard that fails a
test which builds in `make check` anyway."""

import pytest

import tiers

# Module constants, not the tests' code: this file's own tests must stay in the quick tier.
REFERENCE_PROFILE, BUILDER = "reference-1.8.0-hybrid", "make_tiny_llama"


class Item:
    """The parts of a pytest item tiers.mark reads."""

    def __init__(self, function, params=None):
        self.function, self.keywords, self.markers = function, {}, []
        self.fixturenames = ()
        if params is not None:
            self.callspec = type("CallSpec", (), {"params": params})()

    def add_marker(self, name):
        self.markers.append(name)
        self.keywords[name] = True


def _helper_that_builds():
    from factory import reference_package

    return reference_package("reference-16K")


def _calls_a_helper():
    return _helper_that_builds()


def _validates_only(make_pkg):
    """Mentions reference_package() and "reference-16K" only in its docstring."""
    return make_pkg("1.8.0-npu-16K")


def test_a_builder_called_through_a_module_function_marks_builds():
    item = Item(_calls_a_helper)
    tiers.mark([item])
    assert item.markers == ["builds"]


def test_a_reference_profile_parameter_marks_builds_and_a_docstring_does_not():
    built, plain = Item(_validates_only, {"profile_id": REFERENCE_PROFILE}), Item(_validates_only, {"profile_id": "1.8.0-npu-16K"})
    tiers.mark([built, plain])
    assert built.markers == ["builds"] and plain.markers == []


def test_a_builder_fails_its_test_in_the_quick_tier_only(monkeypatch):
    monkeypatch.setenv(tiers.TIER_ENV, "check")
    with pytest.raises(pytest.fail.Exception, match="mark it @pytest.mark.builds"):
        tiers.refuse_in_quick_tier(BUILDER)
    monkeypatch.delenv(tiers.TIER_ENV)
    tiers.refuse_in_quick_tier(BUILDER)  # make test: builds go on
