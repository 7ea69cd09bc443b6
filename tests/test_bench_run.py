"""bench/run.py's exit status: a row that misses its goal or a row group that fails to measure
fails the run, naming the row (issue 13: it used to exit 0 whatever the rows said)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "run.py"


@pytest.fixture
def bench(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("bench_run_under_test", BENCH)
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    monkeypatch.setattr(run, "HERE", tmp_path)  # bench/out/bench.json goes here

    def group(name, rows=None, error=None):
        def measure(tmp):
            if error:
                raise error
            return [dict(r) for r in rows]

        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(rows=measure))
        run.GROUPS.append(name)

    run.group = group
    return run


def row(name, ok):
    return {"name": name, "value": "1.00 s", "ratio": 1.0, "baseline": "b", "goal": "g", "ok": ok, "note": ""}


def test_all_rows_meet_their_goal(bench, capsys):
    bench.group("g_ok", [row("fast", True), row("faster", True)])
    assert bench.main(["g_ok"]) == 0
    assert "2 of 2 rows meet their goal" in capsys.readouterr().out


def test_a_missed_goal_fails_the_run_and_names_the_row(bench, capsys):
    bench.group("g_miss", [row("fast", True), row("slow one", False)])
    assert bench.main(["g_miss"]) == 1
    out = capsys.readouterr().out
    assert "MISS slow one" in out
    assert "missed their goal: slow one" in out


def test_a_group_that_errors_fails_the_run_and_the_others_still_run(bench, capsys):
    bench.group("g_err", error=RuntimeError("disk full"))
    bench.group("g_fine", [row("fast", True)])
    assert bench.main(["g_err", "g_fine"]) == 2
    out = capsys.readouterr().out
    assert "ok   fast" in out
    assert "not measured (error): g_err (not measured)" in out
    assert "RuntimeError: disk full" in out


def test_an_unknown_group_is_a_usage_error(bench, capsys):
    assert bench.main(["no_such_group"]) == 3
    assert "no row group no_such_group" in capsys.readouterr().err
