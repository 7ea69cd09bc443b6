"""report.html: written by every build (listed in its manifest), by `raipack report` for any package, and
opened in a real headless browser (Debian's chromium): screenshot not blank, the stage table, the plots and
the findings in the DOM, no console output, valid HTML, a package's strings shown as text and never run.

The build is the fake-stage build of tests/fake_stages.py (a real reference package, seconds to make), its
stage reports given the fields the real stages record (quality, the smoke run's TTFT per tier)."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import pytest

import fake_stages
from helpers import open_in_chromium
from raipack.builder.recipe import load
from raipack.builder.runner import build
from raipack.cli import main
from raipack.core import manifest
from raipack.validate import validate

HOSTILE = '</td><script>console.error("planted")</script><img src=x onerror="console.error(1)">$\\alpha$'
REPORTS = {  # what the real stages record, in their shapes (see a real build's report.json)
    "quantize": {"summary": f"awq uint4 g64 {HOSTILE}", "quality": {"ppl_source": 30.13, "ppl_quantized": 34.45, "ppl_increase": 0.1433,
                                                                   "answer_source": "Paris.", "answer_quantized": "Paris, France."}},
    "export": {"quality": {"ppl_quark": 35.53, "ppl_exported": 35.53, "ppl_ratio": 1.0, "greedy_identical": True}},
    "smoke": {"device": "cpu-reference", "ttft_s": {"1": 0.09, "125": 0.33, "253": 0.56, "509": 1.2}, "decode_tokens_per_s": 39.9,
              "tiers": [{"tier": 128, "prompt_tokens": 125, "ttft_s": 0.33, "tokens_match_export": True},
                        {"tier": 4096, "prompt_tokens": 3073, "ttft_s": 9.5, "tokens_match_export": None,
                         "export_not_checked": "3073 + 4 tokens are over the check budget's 1092"}],
              "quality": {"device": "cpu-reference", "answer": "Paris", "tokens_match_export": True, "ppl_package": 35.53, "ppl_package_bfp16": 36.24,
                          "answer_bfp16": "Paris.", "numerics_note": "BFP16 as Quark defines it; the NPU's exact arithmetic is not published"}},
}
BENCH = {"format": "raipack-bench", "format_version": 1, "package": "p", "date": "2026-12-02", "machine": {"cores": 2, "cpu": "test cpu"},
         "rows": [{"backend": b, "ran_on": "cpu", "prompt_tokens": n, "gen_tokens": 16, "runs": 3, "peak_rss_mb": 300.0,
                   "ttft_ms": {"median": n * k, "min": n * k * 0.9, "max": n * k * 1.2}, "tokens_per_s": {"median": 40 / k, "min": 38 / k, "max": 41 / k}}
                  for b, k in (("reference", 1.0), ("oga", 0.5)) for n in (128, 256, 512)], "ratios": []}
EVAL = {"results": {"tiny_mc": {"acc,none": 0.5, "acc_stderr,none": 0.1}}, "configs": {}, "versions": {}, "n-shot": {},
        "raipack": {"chain": [{"stage": s, "kind": s, "ran_on": "cpu", "results": {"tiny_mc": {"acc,none": v}},
                               "drop": {"tiny_mc": {"acc,none": {"value": v, "vs_source": d, "vs_previous": d}}}} for s, v, d in (("source", 0.6, 0.0), ("package", 0.5, 0.1))]}}


def _enriched(name: str):
    stage = fake_stages.FAKES[name]
    if name not in REPORTS:
        return stage

    def run(job):
        return {**stage.run(job), **REPORTS[name]}
    return dataclasses.replace(stage, run=run)


@pytest.fixture(scope="module")
def built(tmp_path_factory, reference_packages):
    """A finished fake-stage build: (package folder, what the build printed)."""
    root = tmp_path_factory.mktemp("report-build")
    fakes = {n: _enriched(n) for n in fake_stages.FAKES}
    lines = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAIPACK_CACHE", str(root / "cache"))
        mp.setenv(fake_stages.PACKAGES_ENV, str(reference_packages["reference-16K"].parent))
        mp.setattr("raipack.builder.stages.get", fakes.__getitem__)
        mp.chdir(root)
        from raipack.builder.progress import Progress

        progress = Progress("plain")
        mp.setattr(progress, "line", lambda text, style="": lines.append(text))
        result = build(load(None, {"output": "build"}), progress=progress)
    return root / result.package, lines


def test_every_build_writes_report_html_listed_in_its_manifest(built):
    pkg, lines = built
    page = pkg / "report.html"
    assert page.is_file() and not [x for x in lines if "report.html" in x]
    entry = {f["path"]: f for f in manifest.read(pkg)["files"]}["report.html"]
    import hashlib

    assert entry["sha256"] == hashlib.sha256(page.read_bytes()).hexdigest() and entry["size"] == page.stat().st_size
    result = validate(pkg, verify_hashes=True)
    assert not result.failed(strict=True), [f.to_dict() for f in result.findings]
    html = page.read_text()
    assert 'id="stage-table"' in html and html.count("<svg") == 2  # the stage bars and the smoke run's TTFT
    assert "<script" not in html and "&lt;script&gt;" in html  # a stage's summary is text


def test_a_build_without_matplotlib_warns_once_and_has_no_report_html(tmp_path, monkeypatch, reference_packages):
    monkeypatch.setenv("RAIPACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(fake_stages.PACKAGES_ENV, str(reference_packages["reference-16K"].parent))
    monkeypatch.setattr("raipack.builder.stages.get", fake_stages.FAKES.__getitem__)
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    monkeypatch.chdir(tmp_path)
    from raipack.builder.progress import Progress

    progress, lines = Progress("plain"), []
    monkeypatch.setattr(progress, "line", lambda text, style="": lines.append(text))
    result = build(load(None, {"output": "build"}), progress=progress)
    assert [x for x in lines if "report.html" in x] == ["report.html not written: matplotlib not installed; the report needs matplotlib and jinja2: pip install 'raipack[report]'"]
    assert not (result.package / "report.html").exists()
    assert "report.html" not in {f["path"] for f in manifest.read(result.package)["files"]}
    assert not validate(result.package).failed()


def test_two_renders_are_byte_identical(built):
    from raipack.report.collect import for_package
    from raipack.report.page import render

    data = for_package(built[0])
    first, second = render(data), render(json.loads(json.dumps(data)))
    assert first == second
    assert "Date" not in first and "<?xml" not in first and "<!--" not in first


def test_report_opens_in_a_real_browser(built, tmp_path):
    pkg = shutil.copytree(built[0], tmp_path / built[0].name)
    (pkg / "helper.py").write_text("print('never run')\n")  # a finding with a hint, grouped under its file
    (tmp_path / "bench.json").write_text(json.dumps(BENCH))
    (pkg / "eval.json").write_text(json.dumps(EVAL))  # found beside report.json
    out = tmp_path / "page.html"
    with pytest.raises(SystemExit) as code:
        main(["report", str(pkg), "-o", str(out), "--bench", str(tmp_path / "bench.json")])
    assert code.value.code == 0

    # the console capture works: a page with a script's console.error is seen
    control = tmp_path / "control.html"
    control.write_text("<!DOCTYPE html><title>c</title><script>console.error('seen')</script>")
    assert any("seen" in x for x in open_in_chromium(control, tmp_path)[2])

    shot, dom, console = open_in_chromium(out, tmp_path)
    assert console == []
    from PIL import Image

    with Image.open(shot) as img:
        assert img.size == (1280, 2400)
        colours = img.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 20  # text, table borders, bars, lines: not a blank page

    import html5lib

    doc = html5lib.parse(dom, namespaceHTMLElements=False)
    assert len(doc.findall(".//table[@id='stage-table']/tbody/tr")) == 5
    svgs = [e for e in doc.iter() if e.tag.endswith("svg")]
    assert len(svgs) == 3  # stage bars, TTFT and tokens/s from bench.json
    assert [r.findtext("td") for r in doc.findall(".//table[@id='bench-table']/tbody/tr")][:1] == ["reference"]
    assert [[c.text for c in r.findall("td")][-1] for r in doc.findall(".//table[@id='eval-table']/tbody/tr")] == ["0.0000", "0.1000"]  # drop vs source
    quality = [[c.text for c in r.findall("td")] for r in doc.findall(".//table[@id='quality-table']/tbody/tr")]
    assert len(quality) == 6
    assert quality[-2][1:5] == ["package (cpu-reference, float)", "35.5300", "tokens equal the export's", "+0.00 (+0.00%)"]
    assert quality[-1][1:] == ["package (cpu-reference, BFP16 activations, predicted on the device)", "36.2400", "+2.00% vs float", "+0.71 (+2.00%)",
                               "Paris."]  # the chain's last link, its drop from the float package
    notice = "".join(doc.find(".//p[@id='bfp16-answer-notice']").itertext())  # the first screen: BFP16 changed "Paris" to "Paris."
    assert "BFP16 changes the answer" in notice and "“Paris.”" in notice
    assert "BFP16 as Quark defines it; the NPU's exact arithmetic is not published" in doc.find(".//p[@id='numerics-note']").text
    groups = {h.text: h for h in doc.findall(".//section[@id='findings']/h3")}
    assert "helper.py" in groups and "hint:" in "".join(doc.find(".//section[@id='findings']").itertext())
    assert not doc.findall(".//script") and not doc.findall(".//img")  # the planted markup stayed text
    assert HOSTILE in "".join(doc.find(".//table[@id='stage-table']").itertext())

    html5lib.HTMLParser(strict=True).parse(out.read_text())  # raises on any parse error


def test_bad_input_is_one_sentence_exit_2_and_nothing_written(built, tmp_path, monkeypatch, capsys):
    pkg = built[0]
    bad = tmp_path / "bench.json"
    bad.write_text(json.dumps({**BENCH, "rows": [{"backend": "npu", "prompt_tokens": "many"}]}))
    notes = tmp_path / "eval.json"
    notes.write_text("[1, 2]")
    out = tmp_path / "r.html"
    cases = [
        (["report", str(pkg), "-o", str(out), "--bench", str(bad)], "field rows[0] is not an object with a backend and prompt_tokens"),
        (["report", str(pkg), "-o", str(out), "--eval", str(notes)], "holds a JSON list"),
        (["report", str(tmp_path / "missing"), "-o", str(out)], "does not exist"),
        (["report", str(pkg), "-o", str(tmp_path / "no" / "r.html")], "does not exist"),
    ]
    for argv, words in cases:
        with pytest.raises(SystemExit) as code:
            main(argv)
        err = capsys.readouterr().err
        assert code.value.code == 2 and words in err and err.startswith("ERROR: ") and "Traceback" not in err, err
    assert list(tmp_path.glob("*.html")) == [] and list(tmp_path.glob(".r.html*")) == []
    monkeypatch.chdir(pkg)  # the default output would land inside the package: refused
    with pytest.raises(SystemExit) as code:
        main(["report", "."])
    assert code.value.code == 2 and "inside the package" in capsys.readouterr().err
    import hashlib

    listed = {f["path"]: f["sha256"] for f in manifest.read(pkg)["files"]}["report.html"]
    assert hashlib.sha256((pkg / "report.html").read_bytes()).hexdigest() == listed


def test_eval_json_of_numerics_rows_becomes_a_float_and_a_bfp16_row(tmp_path):
    """raipack eval PACKAGE --numerics bfp16 writes raipack.rows; the page shows one row per numerics, dropped vs float."""
    from raipack.report import inputs
    from raipack.report.collect import eval_tables

    rows = [{"numerics": n, "ran_on": f"cpu-reference {n}", "results": {"prose": {"word_perplexity,none": v}},
             "drop": {"prose": {"word_perplexity,none": {"value": v, "vs_source": d, "vs_previous": d}}}} for n, v, d in (("float", 20.0, 0.0), ("bfp16", 20.5, 0.5))]
    path = tmp_path / "eval.json"
    path.write_text(json.dumps({"results": rows[0]["results"], "raipack": {"kind": "package", "numerics": ["float", "bfp16"], "rows": rows}}))
    table = eval_tables(inputs.evaluation(path))
    assert table["numerics"] and not table["chain"]
    assert [(r["stage"], r["value"], r["drop"]) for r in table["rows"]] == [("package (float)", 20.0, 0.0), ("package (bfp16)", 20.5, 0.5)]
    path.write_text(json.dumps({"results": rows[0]["results"], "raipack": {"rows": [{"numerics": 1}]}}))
    with pytest.raises(Exception, match=r"raipack.rows\[0\]"):
        inputs.evaluation(path)


@pytest.mark.parametrize("drop, field", [(("machine", "cores"), "machine.cores"), (("rows", "ran_on"), "rows[0].ran_on"),
                                         (("rows", "gen_tokens"), "rows[0].gen_tokens"), (("machine", "cpu"), "machine.cpu")])
def test_a_bench_json_missing_a_field_the_page_shows_is_one_sentence(tmp_path, drop, field):
    """Issue 24: bench.json without machine.cores or rows[].ran_on was a jinja2 UndefinedError traceback."""
    import copy

    from raipack.core.errors import UsageError
    from raipack.report.inputs import bench

    doc = copy.deepcopy(BENCH)
    where, key = drop
    for obj in (doc["rows"] if where == "rows" else [doc["machine"]]):
        obj.pop(key)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UsageError, match=rf"bench.json: field {re.escape(field)} is not present as") as info:
        bench(path)
    assert info.value.exit_code == 2
    path.write_text(json.dumps(BENCH))
    assert bench(path)["machine"]["cores"] == 2  # the complete one reads


def test_make_test_waits_for_another_apt_holding_the_lock():
    """Issue 24: `make test`'s chromium install failed at once when another apt held the lock; it waits, bounded."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(["make", "-n", "-B", "chromium"], cwd=root, capture_output=True, text=True, check=True)
    calls = done.stdout.split("apt-get")[1:]
    assert len(calls) == 2 and all(c.lstrip().startswith("-o DPkg::Lock::Timeout=120") for c in calls), done.stdout


def test_the_smoke_tier_table_says_which_tiers_the_export_did_not_check(built):
    """A tier over the check budget (tokens_match_export None) reads "not checked" and why, never "no"."""
    import re

    html = (built[0] / "report.html").read_text()
    table = html[html.index('id="smoke-tier-table"'):]
    rows = re.findall(r"<tr><td class=\"n\">(\d+)</td>.*?<td>([^<]*)</td></tr>", table[: table.index("</table>")])
    assert rows == [("128", "yes"), ("4096", "not checked: 3073 + 4 tokens are over the check budget&#39;s 1092")]
