"""bench/quantize_phases.py's instruments, fast: the phase a wrapped call counts in, the sampled peaks, the table.
(The script itself runs Quark on a model: `python bench/quantize_phases.py --tiny` checks it by hand.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import quantize_phases  # noqa: E402  (bench/, on the path just above)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status (Linux)")
def test_status_reads_this_process_resident_memory():
    now = quantize_phases.status()
    assert set(now) == {"VmRSS", "RssAnon", "RssFile"}
    assert now["VmRSS"] >= now["RssAnon"] > 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status (Linux)")
def test_a_wrapped_call_counts_in_its_phase_and_the_phase_before_comes_back():
    class Steps:
        def search(self, n):
            block = bytearray(n)  # 64 MiB touched inside the phase
            block[::4096] = b"x" * len(block[::4096])
            return len(block)

    phases = quantize_phases.Phases(every_s=10)  # no sampling thread: the wrapper's own note at the end of the call
    phases.wrap(Steps, "search", "scale_search")
    phases.name = "quark"
    phases.note()
    assert Steps().search(64 << 20) == 64 << 20
    assert phases.name == "quark"
    assert set(phases.peaks) == {"quark", "scale_search"}
    with pytest.raises(TypeError):  # a failing call also gives the phase back
        Steps().search("not a size")
    assert phases.name == "quark"


def test_the_table_names_every_phase_and_the_layers():
    g = 2**30
    result = {"seconds": 12.5, "seconds_quark": 9.0, "peak_rss_bytes": 3 * g, "env": {"QUARK_DISABLE_COMPILE": "1", "OMP_WAIT_POLICY": "PASSIVE"},
              "phases": {"load": {"VmRSS": g, "RssAnon": g // 2, "RssFile": g // 2}, "scale_search": {"VmRSS": 3 * g, "RssAnon": 2 * g, "RssFile": g}},
              "layers": [{"layer": 1, "seconds": 4.0, "RssAnon": g, "VmRSS": g, "RssFile": 0}, {"layer": 2, "seconds": 8.0, "RssAnon": 2 * g, "VmRSS": g, "RssFile": 0}]}
    text = quantize_phases.table(result)
    assert "| scale_search | 3.00 GiB | 2.00 GiB | 1.00 GiB |" in text
    assert "quantize()'s peak 3.00 GiB" in text and "at Quark's import {'QUARK_DISABLE_COMPILE': '1', 'OMP_WAIT_POLICY': 'PASSIVE'}" in text
    assert "after decoder layer 1: RssAnon 1.00 GiB; after layer 2: 2.00 GiB (8.0 s)" in text
