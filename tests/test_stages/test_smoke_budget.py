"""The smoke stage's budget: the export checks the package's tokens from one prefill, not a decode loop
per prompt (OrtDecoder.forced), and keeps only the argmax of the rows it compares."""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from factory import reference_export, reference_package
from raipack.core.errors import RaipackError
from raipack.runtime.ortloop import OrtDecoder

PROMPT = [(7 * i) % 500 + 4 for i in range(700)]


@pytest.fixture(scope="module")
def dec():
    return OrtDecoder(reference_export()[0], threads=1)


def counting(monkeypatch, dec):
    calls = []
    forward = dec.forward

    def spy(ids, past):
        calls.append(np.asarray(ids).shape[1])
        return forward(ids, past)

    monkeypatch.setattr(dec, "forward", spy)
    return calls


def test_forced_gives_greedys_tokens_for_every_prefix_from_one_prefill(dec, monkeypatch):
    want = {n: dec.greedy(PROMPT[:n], 4)[0] for n in (1, 5, 300, 700)}
    calls = counting(monkeypatch, dec)
    assert dec.forced(PROMPT, want, chunk_size=256) == want
    # three calls of at most 256 positions over the longest prefix, then one call of 3 tokens per prefix
    assert calls == [256, 256, 188, 3, 3, 3, 3]
    assert dec.forced(PROMPT[:300], {300: want[300]}) == {300: want[300]}  # unchunked too


def test_a_decoder_with_logits_rows_computes_only_the_rows_asked_for(dec):
    """logits_rows: the lm_head reads the positions given (the same rows as the whole graph's, in that order), and
    forced() asks for the rows it compares only: the same tokens as the plain graph from far smaller outputs."""
    rows = OrtDecoder(reference_export()[0], threads=1, logits_rows=True)
    ids = np.asarray(PROMPT[:50], np.int64)[None, :]
    full, present = dec.forward(ids, dec.empty_past())
    some, present_rows = rows.forward(ids, rows.empty_past(), [49, 0, 17])
    assert some.shape == (1, 3, full.shape[-1]) and np.allclose(some[0], full[0, [49, 0, 17]], atol=1e-5)
    assert all(np.array_equal(a, b) for pa, pb in zip(present, present_rows) for a, b in zip(pa, pb))  # the keys and values are untouched
    assert rows.forward(ids, rows.empty_past())[0].shape == full.shape  # no rows given: all of them
    want = {n: dec.greedy(PROMPT[:n], 4)[0] for n in (1, 700)}
    sizes = []
    forward = rows.forward
    rows.forward = lambda ids, past, which=None: (lambda out: (sizes.append(out[0].shape[1]), out)[1])(forward(ids, past, which))
    assert rows.forced(PROMPT, want, chunk_size=256) == want
    assert sizes == [1, 1, 1, 3, 3]  # row 0; none asked in the second chunk of 256 (one computed, unread); row 699; each branch's three tokens


def test_greedy_on_a_decoder_with_logits_rows_computes_each_prefill_calls_last_row_only(dec):
    """greedy() reads the prompt's last row: with logits_rows each prefill call computes that one row (a 5000-token
    prompt's rows are 2.6 GB at a 128K vocabulary), and the tokens and the rows they were chosen from are the same."""
    rows = OrtDecoder(reference_export()[0], threads=1, logits_rows=True)
    want, want_rows = dec.greedy(PROMPT, 5, chunk_size=256)
    sizes = []
    forward = rows.forward
    rows.forward = lambda ids, past, which=None: (lambda out: (sizes.append(out[0].shape[1]), out)[1])(forward(ids, past, which))
    got, got_rows = rows.greedy(PROMPT, 5, chunk_size=256)
    assert got == want and all(np.allclose(a, b, atol=1e-4) for a, b in zip(got_rows, want_rows))
    assert sizes == [1, 1, 1, 1, 1, 1, 1]  # three prefill calls (256, 256, 188 positions), then four decode steps


def test_forced_names_the_first_token_greedy_would_change(dec):
    want = dec.greedy(PROMPT[:40], 5)[0]
    changed = list(want)
    changed[2] = (want[2] + 1) % 512
    got = dec.forced(PROMPT[:40], {40: changed})[40]
    assert got[:3] == want[:3] and got[2] != changed[2]  # row 2 still sees want[:2]: it chooses want[2]


def test_forced_falls_back_to_greedy_when_the_lm_head_returns_the_last_row_only(dec, monkeypatch):
    want = {1: dec.greedy(PROMPT[:1], 3)[0], 60: dec.greedy(PROMPT[:60], 3)[0]}
    forward = dec.forward
    monkeypatch.setattr(dec, "forward", lambda ids, past: (lambda out: (out[0][:, -1:], out[1]))(forward(ids, past)))
    assert dec.forced(PROMPT, want, chunk_size=32) == want


def test_forced_refuses_an_empty_request(dec):
    for branches in ({3: []}, {0: [5]}, {701: [5]}, {}):
        with pytest.raises(ValueError, match="prefix lengths from 1 to the prompt's 700 tokens"):
            dec.forced(PROMPT, branches)


def smoke_job(**config):
    from raipack.builder.progress import Progress
    from raipack.core.stage import Job
    from raipack.stages.smoke import stage

    cfg = stage.SmokeConfig(**{"perplexity": False, "max_new_tokens": 16, **config})
    return Job(stage=stage.STAGE, config=cfg, inputs={"fuse": reference_package("reference-4K"), "export": reference_export()[0]},
               workdir=Path(tempfile.mkdtemp()), profile={}, recipe=SimpleNamespace(model=None, expected_answer=None), progress=Progress("quiet"))


def test_smoke_checks_every_tier_against_one_export_prefill(monkeypatch):
    from raipack.stages.smoke import stage

    calls = []
    forward = OrtDecoder.forward
    monkeypatch.setattr(OrtDecoder, "forward", lambda self, ids, past, rows=None: calls.append(np.asarray(ids).shape[1]) or forward(self, ids, past, rows))
    report = stage.run(smoke_job(export_check="all"))
    assert report["finite"] and report["tokens_match_export"]
    tiers = report["tiers"]
    assert [t["tier"] for t in tiers] == [1, 128, 256, 512, 768, 1024, 4096] and all(t["tokens_match_export"] for t in tiers)
    longest, chunk = tiers[-1]["prompt_tokens"], stage.EXPORT_CHUNK
    # the fixed prompt: its prefill, then one call over the package's other 15 tokens; the tiers: the longest
    # prompt in chunks, then one call over tier_new_tokens - 1 tokens per tier; never a decode loop
    assert calls[1:] == [15] + [chunk] * (longest // chunk) + [longest % chunk] + [3] * len(tiers)
    assert calls[0] > 1 and longest == 3073  # the largest tier's shortest prompt (its last chunk is one token: 3073 = 6 x 512 + 1)
    # the stage's time in parts: the package's runs (its work) and the export's check (raipack's own; no perplexity asked)
    assert report["seconds_package"] > 0 and report["seconds_export_check"] > 0 and "seconds_perplexity" not in report

def test_the_package_perplexity_runs_under_bfp16_or_when_asked():
    """Under float numerics the package's perplexity (its window's prefill on a scoring runtime: a model load of its own) runs
    only when asked; it is timed apart from the package's runs, as raipack's own check."""
    from raipack.stages.smoke import stage

    default = stage.run(smoke_job(perplexity=None, tiers="all", max_tier=1))
    assert "ppl_package" not in default and "seconds_perplexity" not in default and "ppl_package" not in default["quality"]
    asked = stage.run(smoke_job(perplexity=True, tiers="all", max_tier=1))
    assert asked["ppl_package"] > 1 and asked["seconds_perplexity"] > 0 and asked["quality"]["ppl_window_tokens"] == asked["ppl_window_tokens"] > 1
    assert asked["tokens_match_export"] and default["answer"] == asked["answer"]


def test_a_tier_whose_tokens_differ_from_the_export_fails_the_smoke_stage(monkeypatch):
    from raipack.runtime import chat
    from raipack.stages.smoke import stage

    generate = chat.timed_generate

    def wrong_at_tier_128(runtime, ids, n, stop_at_eos=True):
        out = generate(runtime, ids, n, stop_at_eos)
        if len(ids) == 125:  # the package "chooses" another last token at tier 128
            out.tokens[-1] = (out.tokens[-1] + 1) % 512
        return out

    monkeypatch.setattr(chat, "timed_generate", wrong_at_tier_128)
    with pytest.raises(RaipackError, match="prefill tier 128: tokens differ from the export"):
        stage.run(smoke_job(tiers="all", max_tier=512))


def test_the_bench_compares_old_and_new_on_the_tiny_package(capsys):
    """bench/smoke_export.py runs (its default inputs: this package and export) and finds the same tokens both ways."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import smoke_export

    assert smoke_export.main(["--repeat", "1", "--package", str(reference_package("reference-4K")), "--export", str(reference_export()[0])]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert " 92 calls" in lines["old"] and " 16 calls" in lines["new"] and "CPU ratio  1.00" in lines["old"]


def test_by_default_the_largest_tier_runs_but_the_export_compares_only_the_tiers_up_to_1024(monkeypatch):
    """The package still runs every tier (its own work), the export's forward stops at the longest prompt up to
    all_tiers_up_to: the largest tier's record says it was not compared and why, and the stage passes;
    `export_check = "all"` (or tiers = "all") compares it."""
    from raipack.stages.smoke import stage

    calls = []
    forward = OrtDecoder.forward
    monkeypatch.setattr(OrtDecoder, "forward", lambda self, ids, past, rows=None: calls.append(np.asarray(ids).shape[1]) or forward(self, ids, past, rows))
    report = stage.run(smoke_job(export_check="auto"))
    tiers = report["tiers"]
    assert [t["tier"] for t in tiers] == [1, 128, 256, 512, 768, 1024, 4096] and tiers[-1]["prompt_tokens"] == 3073
    assert all(t["tokens_match_export"] is True for t in tiers[:-1]) and tiers[-1]["tokens_match_export"] is None
    assert "export_check = \"all\" compares it" in tiers[-1]["export_not_checked"] and "3073 + 4 tokens" in tiers[-1]["export_not_checked"]
    assert tiers[-1]["finite"] and tiers[-1]["prefill_calls"] == [4096]  # run by the package all the same
    # the export's prefill reads the longest compared prompt (1021 tokens: 512 + 509), then one call per compared tier
    assert calls[1:] == [15, 512, 509] + [3] * 6
    calls.clear()
    low = stage.run(smoke_job(export_check="auto", all_tiers_up_to=256))
    assert [t["tokens_match_export"] for t in low["tiers"]] == [True, True, True, None]  # 1, 128, 256; the largest
    assert calls[1:] == [15, 253] + [3] * 3


def test_a_tier_over_the_budget_is_never_reported_as_differing(monkeypatch):
    """Not checked is not a failure: _problems names a tier only when its tokens differ (False), not when None."""
    from raipack.stages.smoke import stage

    report = {"tiers": [{"tier": 4096, "finite": True, "tokens_match_export": None}, {"tier": 128, "finite": True, "tokens_match_export": False}]}
    assert stage._problems(report, None) == ["prefill tier 128: tokens differ from the export"]


def test_a_bad_export_check_is_refused():
    from raipack.core.errors import UsageError
    from raipack.stages.smoke import stage

    with pytest.raises(UsageError, match=r"\[smoke\].export_check is 'some'; expected \"auto\" or \"all\""):
        stage.run(smoke_job(export_check="some"))


@pytest.mark.parametrize(("budget", "expected"), [
    ({"scale": 0.2667, "answer_tokens": 8}, 8),
    ({"scale": 1.0, "answer_tokens": 16}, 16),
    ({"answer_tokens": "8"}, None),
    ({"answer_tokens": True}, None),
    ({"answer_tokens": 0}, None),
    (None, None),
])
def test_the_bfp16_answer_length_is_read_from_the_exports_report_and_an_odd_one_is_ignored(tmp_path, budget, expected):
    import json

    from raipack.stages.smoke import device

    (tmp_path / "manifest.json").write_text(json.dumps({"report": {"check_budget": budget}}))
    assert device.export_answer_tokens(tmp_path) == expected
    assert device.export_answer_tokens(tmp_path / "missing") is None
