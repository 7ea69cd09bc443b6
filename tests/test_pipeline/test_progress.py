"""Progress output in each mode: plain lines, JSON lines for CI, quiet."""

import io
import json

from raipack.builder.progress import Progress


def drive(mode):
    out = io.StringIO()
    p = Progress(mode, out)
    cb = p.callback("quantize")
    for i in range(1, 31):
        cb("awq layers", i, 30)
    p.stage("quantize", "built", 12.34, "awq uint4 g64")
    p.stage("export", "cached", 0.01)
    return out.getvalue()


def test_plain_prints_a_line_per_stage_and_nothing_for_a_short_step():
    text = drive("plain")
    assert "✔ quantize  built      12.3 s  awq uint4 g64" in text
    assert "export    cached" in text
    assert "awq layers" not in text  # a step of less than PLAIN_AFTER_SECONDS: its stage line says it all


def test_plain_prints_three_lines_at_most_for_a_long_step(monkeypatch):
    from raipack.builder import progress

    monkeypatch.setattr(progress, "PLAIN_AFTER_SECONDS", 0.0)  # every step counts as long
    text = drive("plain")
    assert [line.split(" (")[0] for line in text.splitlines() if "awq layers" in line] == [
        "  quantize: awq layers 8/30", "  quantize: awq layers 15/30", "  quantize: awq layers 23/30"]  # 1/4, 1/2, 3/4
    out = io.StringIO()
    with Progress("plain", out).task("prefill tiers", 10) as advance:
        for _ in range(10):
            advance()
    assert [line.split(" (")[0] for line in out.getvalue().splitlines()] == ["  prefill tiers: 3/10", "  prefill tiers: 5/10", "  prefill tiers: 8/10"]


def test_json_log_is_machine_readable():
    events = [json.loads(line) for line in drive("json").splitlines()]
    stages = [e for e in events if e["event"] == "stage"]
    assert [(e["stage"], e["status"]) for e in stages] == [("quantize", "built"), ("export", "cached")]
    assert sum(1 for e in events if e["event"] == "task") == 30


def test_quiet_prints_nothing():
    assert drive("quiet") == ""


def test_auto_is_plain_when_not_a_terminal():
    assert Progress("auto", io.StringIO()).mode == "plain"
