"""One numerics check below run, bench and eval (raipack.runtime.numerics.ready): each mode checked,
amd-quark required for bfp16 before anything loads, with the same sentence from every command."""

from __future__ import annotations

import importlib.util

import pytest

from raipack.core.errors import UsageError
from raipack.runtime import numerics


@pytest.fixture
def no_quark(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "quark" else real(name, *a))


def test_modes_are_checked_and_kept_once_in_order():
    assert numerics.ready(["float", "float"]) == ["float"]
    with pytest.raises(UsageError, match="--numerics is 'fp8'; expected one of float, bfp16"):
        numerics.ready(["float", "fp8"])


def test_bfp16_without_quark_is_refused_by_ready(no_quark):
    with pytest.raises(UsageError, match="needs amd-quark"):
        numerics.ready(["float", "bfp16"])
    assert numerics.ready(["float"]) == ["float"]  # float needs no Quark


def test_run_and_bench_refuse_bfp16_without_quark_before_looking_at_the_package(no_quark, tmp_path):
    """A folder that does not exist: the numerics sentence comes first, from the one check."""
    from raipack.benchmark import Runs, make_plan
    from raipack.runtime.run import RunOptions, answer

    missing = tmp_path / "no-such-package"
    with pytest.raises(UsageError, match="needs amd-quark"):
        answer(missing, "hello", RunOptions(numerics="bfp16"))
    with pytest.raises(UsageError, match="needs amd-quark"):
        make_plan(missing, None, Runs(), numerics=["bfp16"])
    with pytest.raises(UsageError, match="is not a package folder"):
        answer(missing, "hello", RunOptions(numerics="float"))
