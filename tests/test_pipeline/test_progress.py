"""Progress output in each mode: plain lines, JSON lines for CI, quiet."""

import io
import json

from pipeline.build.progress import Progress


def drive(mode):
    out = io.StringIO()
    p = Progress(mode, out)
    cb = p.callback("quantize")
    for i in range(1, 31):
        cb("awq layers", i, 30)
    p.stage("quantize", "built", 12.34, "awq uint4 g64")
    p.stage("export", "cached", 0.01)
    return out.getvalue()


def test_plain_prints_a_line_per_stage_and_every_tenth_of_a_step():
    text = drive("plain")
    assert "✔ quantize  built      12.3 s  awq uint4 g64" in text
    assert "export    cached" in text
    assert text.count("awq layers") == 11  # 1/30, then each 10 %


def test_json_log_is_machine_readable():
    events = [json.loads(line) for line in drive("json").splitlines()]
    stages = [e for e in events if e["event"] == "stage"]
    assert [(e["stage"], e["status"]) for e in stages] == [("quantize", "built"), ("export", "cached")]
    assert sum(1 for e in events if e["event"] == "task") == 30


def test_quiet_prints_nothing():
    assert drive("quiet") == ""


def test_auto_is_plain_when_not_a_terminal():
    assert Progress("auto", io.StringIO()).mode == "plain"
