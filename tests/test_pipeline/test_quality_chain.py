"""Issue 39: the perplexity chain source → Quark → export → package (float) → package (BFP16, predicted on
the device) with each link's drop, in report.html (its first screen when BFP16 changes the answer),
report.json's "quality_chain", the model card and the build's last lines; the TTFT plot of warm runs."""

from __future__ import annotations

import html5lib
import pytest

from raipack.report import chain
from raipack.report.collect import page_data, performance

QUALITY = {  # the fields the real stages record (docs/measurements/bfp16.md's example)
    "quantize": {"ppl_source": 30.1326, "ppl_quantized": 34.5985, "ppl_increase": 0.1482, "answer_source": "The capital of France is Paris.",
                 "answer_quantized": "The capital of France is Paris, France."},
    "export": {"ppl_quark": 35.6353, "ppl_exported": 35.6353, "ppl_ratio": 1.0, "greedy_identical": True},
    "smoke": {"device": "cpu-reference", "answer": "The capital of France is Paris, France.", "tokens_match_export": True, "numerics": "bfp16",
              "ppl_package": 35.6353, "ppl_package_bfp16": 35.8725, "answer_bfp16": "Ladies and gentlemen, the capital of France is Paris.",
              "numerics_changed_answer": True, "numerics_note": "BFP16 as Quark defines it; the NPU's exact arithmetic is not published"},
}


def stages(**smoke) -> list[dict]:
    return [{"name": n, "status": "built", "seconds": 1.0, "report": {"quality": dict(q, **(smoke if n == "smoke" else {}))}} for n, q in QUALITY.items()]


def test_every_link_has_its_drop_from_the_link_before_on_one_window():
    rows = chain.quality_chain(stages())
    assert [r["model"] for r in rows] == ["source", "quantized (Quark)", "Quark model (export's window)", "export", "package (cpu-reference, float)",
                                          "package (cpu-reference, BFP16 activations, predicted on the device)"]
    assert [r["drop"] for r in rows] == [None, "+4.47 (+14.82%)", None, "+0.00 (+0.00%)", "+0.00 (+0.00%)", "+0.24 (+0.67%)"]
    assert rows[-1]["note"] == "BFP16 as Quark defines it; the NPU's exact arithmetic is not published"


def test_the_build_report_and_the_last_lines_carry_the_chain_and_what_bfp16_is():
    doc = chain.document(stages())
    assert doc["bfp16_changed_answer"] == {"float": "The capital of France is Paris, France.", "bfp16": "Ladies and gentlemen, the capital of France is Paris."}
    assert "not published" in doc["note"] and len(doc["rows"]) == 6
    lines = chain.chain_lines(stages())
    assert lines[0] == ("perplexity source 30.13 → quantized (Quark) 34.60 (+4.47 (+14.82%)) → export 35.64 (+0.00 (+0.00%)) → package (float) 35.64 "
                        "(+0.00 (+0.00%)) → package (BFP16, predicted) 35.87 (+0.24 (+0.67%))")
    assert lines[1] == "BFP16: BFP16 as Quark defines it; the NPU's exact arithmetic is not published"
    assert lines[2].startswith("BFP16 changes the answer to the fixed prompt: float 'The capital of France is Paris, France.'")
    float_only = [s if s["name"] != "smoke" else {**s, "report": {"quality": {k: v for k, v in QUALITY["smoke"].items() if "bfp16" not in k}}}
                  for s in stages()]
    assert chain.document(float_only)["bfp16_changed_answer"] is None and "note" not in chain.document(float_only)
    assert len(chain.chain_lines(float_only)) == 1 and chain.document([]) is None


def test_the_model_card_shows_the_chain():
    from raipack.builder.model_card import build_section

    report = {"profile": "1.8.0-npu-16K", "seconds": 60.0, "tools": {}, "stages": stages()}
    text = build_section(report)
    assert "- perplexity source 30.13 → " in text and "package (BFP16, predicted) 35.87" in text
    assert "AMD's exact arithmetic is not published" in text


def _page(stage_list: list[dict]) -> html5lib.etree:
    pytest.importorskip("matplotlib")
    from raipack.report.page import render

    summary = {"profile": "reference-16K", "runs_on": "cpu", "tiers": [], "buckets": {}, "files": {}, "quantization": {"method": None}}
    return html5lib.parse(render(page_data("pkg", summary, [], {"stages": stage_list, "seconds": 1.0}, None, None)), namespaceHTMLElements=False)


def test_the_first_screen_says_when_bfp16_changes_the_answer():
    doc = _page(stages())
    header = doc.find(".//header")
    notice = "".join(header.find(".//p[@id='bfp16-answer-notice']").itertext())
    assert "BFP16 changes the answer" in notice and "Ladies and gentlemen" in notice
    assert "package (BFP16, predicted) 35.87" in "".join(header.find(".//ul[@id='chain-summary']").itertext())
    same = _page(stages(answer_bfp16=QUALITY["smoke"]["answer"], numerics_changed_answer=False))
    assert same.find(".//p[@id='bfp16-answer-notice']") is None


def test_the_ttft_plot_shows_warm_runs_and_names_the_cold_call():
    smoke = [{"name": "smoke", "seconds": 72.0, "report": {"device": "cpu-reference", "ttft_cold_s": 1.96, "ttft_s": {"37": 0.21, "125": 0.6, "253": 0.9},
                                          "decode_tokens_per_s": 30.0}}]
    perf = performance(smoke, None)
    assert [p["prompt_tokens"] for p in perf["series"]["cpu-reference (warm)"]] == [37, 125, 253]
    assert perf["cold"] == {"prompt_tokens": 37, "ttft_s": 1.96}
    # a report from before the warm-up call: its first call, the fixed prompt's, was the cold one and is not plotted
    old = performance([{"name": "smoke", "report": {"device": "cpu-reference", "ttft_s": {"37": 1.96, "125": 0.6, "253": 0.9}}}], None)
    assert [p["prompt_tokens"] for p in old["series"]["cpu-reference (warm)"]] == [125, 253] and old["cold"] == {"prompt_tokens": 37, "ttft_s": 1.96}
    doc = _page(smoke)
    assert "1.96 s for 37 tokens" in "".join(doc.find(".//span[@id='ttft-cold']").itertext())
