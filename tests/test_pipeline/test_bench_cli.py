"""raipack bench: the package beside its export, the JSON/CSV/text shapes, the median math, the
refusals (a length above the prompt limit, --backend npu on a machine without the Ryzen AI runtime),
prompts.txt in built packages, and the export found through the manifest's lineage."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from factory import reference_export, reference_package
from fake_machine import fake_machine
from helpers import run_cli
from raipack.benchmark import Plan, Runs, bench, find_export, make_plan, npu_ready, parse_lengths
from raipack.benchmark.render import as_csv, as_text
from raipack.core.errors import UsageError
from raipack.runtime.prompts import Tokens, defaults, read_lines
from raipack.validate import validate

RAIPACK = str(Path(sys.executable).with_name("raipack"))
NO_NPU = ("RYZENAI_EP_PATH", "RYZEN_AI_INSTALLATION_PATH")


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One real side-by-side run on the tiny 16K package and its export (-l 64,32 -g 4 --runs 2), as a
    process started from a folder holding a planted `pipeline` package and `onnxruntime_genai` module
    that would write a marker file if imported."""
    cwd = tmp_path_factory.mktemp("planted")
    for rel in ("pipeline/__init__.py", "pipeline/benchmark/__init__.py", "pipeline/benchmark/child.py", "onnxruntime_genai.py"):
        (cwd / rel).parent.mkdir(parents=True, exist_ok=True)
        (cwd / rel).write_text(f"open({str(cwd / 'IMPORTED')!r}, 'a').write({rel!r})\n")
    out = cwd / "bench.json"
    env = {k: v for k, v in os.environ.items() if k not in NO_NPU}
    proc = subprocess.run([RAIPACK, "bench", str(reference_package("reference-16K")), "--export", str(reference_export()[0]), "-l", "64,32", "-g", "4",
                           "--runs", "2", "--warmup", "1", "--numerics", "float", "--format", "json", "-o", str(out)], cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text()), cwd


def test_side_by_side_rows_ratios_and_json_shape(measured):
    doc, cwd = measured
    assert not (cwd / "IMPORTED").exists(), "a module of the current folder was imported"
    assert doc["format"] == "raipack-bench" and doc["format_version"] == 1
    assert doc["machine"]["cores"] == os.cpu_count() and doc["date"].endswith("Z")
    assert [(r["backend"], r["prompt_tokens"]) for r in doc["rows"]] == [("reference", 64), ("reference", 32), ("oga", 64), ("oga", 32)]
    for r in doc["rows"]:
        assert r["runs"] == 2 and r["gen_tokens"] == 4 and r["prompt_source"] == "prompts.txt"
        for key in ("ttft_ms", "tokens_per_s"):
            assert 0 < r[key]["min"] <= r[key]["median"] <= r[key]["max"]
        assert r["peak_rss_mb"] > 20
    assert doc["rows"][0]["ran_on"].startswith("raipack reference runtime")
    assert doc["rows"][2]["ran_on"].startswith("onnxruntime-genai ")
    by = {(r["backend"], r["prompt_tokens"]): r for r in doc["rows"]}
    assert [q["prompt_tokens"] for q in doc["ratios"]] == [64, 32]
    for q in doc["ratios"]:
        ref, oga = by[("reference", q["prompt_tokens"])], by[("oga", q["prompt_tokens"])]
        assert q["of"] == "reference/oga"
        assert q["ttft"] == pytest.approx(ref["ttft_ms"]["median"] / oga["ttft_ms"]["median"], abs=0.01)
        assert q["peak_rss"] == pytest.approx(ref["peak_rss_mb"] / oga["peak_rss_mb"], abs=0.01)


def test_text_table_and_csv_have_both_backends_and_ratios(measured):
    doc, _ = measured
    text = as_text(doc)
    header = next(line for line in text.splitlines() if line.strip().startswith("prompt len"))
    for col in ("reference TTFT ms", "reference tok/s", "reference peak MB", "oga TTFT ms", "oga tok/s", "oga peak MB", "TTFT ×", "tok/s ×", "peak ×"):
        assert col in header
    assert f"{doc['machine']['cores']} cores" in text and "load average" in text
    rows = [line.split() for line in text.splitlines() if line.strip()[:3] in ("64 ", "32 ")]
    assert [r[0] for r in rows] == ["64", "32"] and rows[0][-1] == f"{doc['ratios'][0]['peak_rss']:.2f}"
    lines = as_csv(doc).splitlines()
    assert lines[0].split(",")[:3] == ["backend", "ran_on", "prompt_tokens"]
    assert [line.split(",")[0] for line in lines[1:]] == ["reference"] * 2 + ["oga"] * 2 + ["reference/oga"] * 2


def fake_plan(**kw) -> Plan:
    return Plan(Path("pkg"), [256], 8, 3, 0, [("reference", Path("pkg")), ("oga", Path("oga"))], prompt_source={256: "prompts.txt"}, **kw)


def fake_runner(timings: dict, key: str, jobs: list):
    """A child that reports `timings[job[key]]` (TTFT runs, tok/s runs, peak MB) for a 256-token prompt."""
    def runner(job, env):
        jobs.append(job)
        ttft, tps, peak = timings[job[key]]
        return {"ran_on": f"{job['backend']} here", "rows": [{"prompt_tokens": 256, "ttft_s": ttft, "tokens_per_s": tps, "gen_tokens": 8,
                                                            "peak_rss_mb": peak, "peak_rss_scope": "length"}]}
    return runner


def test_median_min_max_and_ratios_on_fake_timings():
    timings = {"reference": ([0.3, 0.1, 0.2], [10.0, 30.0, 20.0], 500.0), "oga": ([0.05, 0.15, 0.1], [40.0, 50.0, 60.0], 250.0)}
    jobs = []
    doc = bench(fake_plan(), runner=fake_runner(timings, "backend", jobs))
    ref, oga = doc["rows"]
    assert ref["ttft_ms"] == {"median": 200.0, "min": 100.0, "max": 300.0}
    assert ref["tokens_per_s"] == {"median": 20.0, "min": 10.0, "max": 30.0}
    assert oga["ttft_ms"] == {"median": 100.0, "min": 50.0, "max": 150.0}
    assert doc["ratios"] == [{"prompt_tokens": 256, "of": "reference/oga", "ttft": 2.0, "tokens_per_s": 0.4, "peak_rss": 2.0}]
    assert [j["backend"] for j in jobs] == ["reference", "oga"] and jobs[0]["max_length"] == 256 + 8 + 1


def test_a_backend_that_fails_is_one_sentence():
    with pytest.raises(Exception) as exc:
        bench(fake_plan(), runner=lambda job, env: {"error": "ValueError: boom"})
    assert str(exc.value) == "the reference backend could not be measured on pkg: ValueError: boom"


@pytest.mark.parametrize("pid, asked, why", [("reference-16K", "4097", "is above the package's prompt limit of 4096 tokens (rai_config.json max_prompt_length[1.8.0])"),
                                              ("reference-16K", "64,9000", "is above the package's prompt limit of 4096 tokens (rai_config.json max_prompt_length[1.8.0])"),
                                              ("reference-4K", "4096", "is too long to add 4 generated tokens within the package's maximum length of 4096")])
def test_length_over_the_limit_exit_2_nothing_written(pid, asked, why, tmp_path, capsys):
    out = tmp_path / "bench.json"
    code, stdout, err = run_cli(capsys, "bench", reference_package(pid), "-l", asked, "-g", "4", "--format", "json", "-o", out)
    assert code == 2 and not out.exists() and stdout == ""
    assert err.splitlines()[0] == f"ERROR: prompt length {asked.split(',')[-1]} {why}"
    assert len(err.splitlines()) == 2 and err.splitlines()[1].startswith("  hint: ")


@pytest.mark.parametrize("text", ["0", "abc", "-5", "64,,32", "1.5"])
def test_lengths_must_be_positive_whole_numbers(text):
    with pytest.raises(UsageError, match="positive whole numbers"):
        parse_lengths(text)
    assert parse_lengths(" 64, 32,64") == [64, 32]


def test_backend_npu_is_refused_on_this_machine(tmp_path, capsys, monkeypatch):
    for name in NO_NPU:
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "b.json"
    code, stdout, err = run_cli(capsys, "bench", reference_package("reference-16K"), "--backend", "npu", "-l", "32", "-o", out)
    assert code == 1 and not out.exists()
    assert err.splitlines()[0] == ("ERROR: --backend npu cannot run on this machine: no RyzenAI provider library found: RYZENAI_EP_PATH is not set "
                                   "and RYZEN_AI_INSTALLATION_PATH is not set (the current folder is never searched)")


def test_npu_is_tried_only_with_a_provider_library_outside_the_inputs(tmp_path, monkeypatch):
    pkg = reference_package("reference-16K")
    lib = tmp_path / "ryzen" / "libonnxruntime_providers_ryzenai.so"
    lib.parent.mkdir()
    lib.write_bytes(b"\x7fELF")
    monkeypatch.setenv("RYZENAI_EP_PATH", str(lib))
    fake_machine(monkeypatch)  # the NPU, the library loading and OGA's provider: probes of a machine we lack
    env, why = npu_ready(pkg, None)
    assert env == {"RYZENAI_EP_PATH": str(lib.resolve())} and why == ""
    env, why = npu_ready(pkg, lib.parent)  # a library inside the export is never loaded
    assert env is None and "never loaded" in why


def test_export_found_through_the_manifest_lineage(tmp_path):
    pkg, root = tmp_path / "pkg", tmp_path / "cache"
    pkg.mkdir()
    entry = root / "stages" / "export" / "abc123"
    entry.mkdir(parents=True)
    (pkg / "manifest.json").write_text(json.dumps({"complete": True, "lineage": {"stages": [{"name": "fuse", "cache_key": "f1"}, {"name": "export", "cache_key": "abc123"}]}}))
    assert find_export(pkg, root)[0] is None and "not in the build cache" in find_export(pkg, root)[1]
    (entry / "manifest.json").write_text(json.dumps({"complete": True}))
    (entry / "genai_config.json").write_text("{}")
    assert find_export(pkg, root) == (entry, "")
    (pkg / "manifest.json").write_text(json.dumps({"complete": True, "lineage": {"stages": [{"name": "export", "cache_key": "../../x"}]}}))
    assert find_export(pkg, root)[0] is None
    (pkg / "manifest.json").unlink()
    assert "manifest.json is missing" in find_export(pkg, root)[1]


def test_without_an_export_the_package_is_measured_alone_and_oga_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("RAIPACK_CACHE", str(tmp_path / "empty-cache"))
    pkg = reference_package("reference-16K")
    plan = make_plan(pkg, [32], Runs(4, 1, 0), numerics=["float"])
    assert [b for b, _ in plan.backends] == ["reference"]
    assert any(n.startswith("export not found") and "measuring the package alone" in n for n in plan.notes)
    assert len(plan.prompts[32]) == 32 and plan.prompt_source[32] == "prompts.txt"
    with pytest.raises(Exception, match="--backend oga needs the package's unfused export"):
        make_plan(pkg, [32], Runs(4, 1, 0), "oga")


def test_default_lengths_keep_what_fits(tmp_path, monkeypatch):
    monkeypatch.setenv("RAIPACK_CACHE", str(tmp_path / "empty-cache"))
    plan = make_plan(reference_package("reference-16K"), None, Runs(4000, 1, 0), "reference")
    assert plan.lengths == [n for n in defaults()["lengths"] if n <= 4096]  # 16384 - 4000 leaves room for all up to the 4096 limit
    plan = make_plan(reference_package("reference-4K"), None, Runs(2500, 1, 0), "reference")
    assert plan.lengths == [1024, 512, 256, 128] and any("skipped" in n for n in plan.notes)


def test_prompts_txt_in_built_packages_is_accepted_by_validate(tmp_path):
    for pid in ("reference-16K", "reference-4K", "reference-1.8.0-hybrid"):
        pkg = reference_package(pid)
        lines = read_lines(pkg / "prompts.txt")
        tokens = Tokens(pkg / "tokenizer.json")
        assert [len(tokens.encode(line)) for line in lines] == [n for n in defaults()["lengths"] if n <= 4096], pid
        assert validate(pkg).findings == [], pid
    # validation of a package whose manifest lists prompts.txt and then sees it changed: not "ok"
    copy = tmp_path / "pkg"
    shutil.copytree(reference_package("reference-16K"), copy)
    (copy / "prompts.txt").write_text("edited after the build\n")
    assert validate(copy, verify_hashes=True).failed()


# ------------------------------------------------------------------ --numerics bfp16 (issue 26)


def test_bfp16_rows_get_their_own_ratio_against_float_on_fake_timings():
    timings = {"float": ([0.1, 0.1, 0.1], [40.0, 40.0, 40.0], 100.0), "bfp16": ([0.3, 0.3, 0.3], [10.0, 10.0, 10.0], 300.0)}
    jobs = []
    plan = Plan(Path("pkg"), [256], 8, 3, 0, [("reference", Path("pkg")), ("reference-bfp16", Path("pkg"))], prompt_source={256: "prompts.txt"})
    doc = bench(plan, runner=fake_runner(timings, "numerics", jobs))
    assert [(j["backend"], j["numerics"]) for j in jobs] == [("reference", "float"), ("reference", "bfp16")]
    assert [r["backend"] for r in doc["rows"]] == ["reference", "reference-bfp16"]
    assert doc["ratios"] == [{"prompt_tokens": 256, "of": "reference-bfp16/reference", "ttft": 3.0, "tokens_per_s": 0.25, "peak_rss": 3.0}]
    text = as_text(doc)
    assert "reference-bfp16 TTFT ms" in text and "reference-bfp16 tok/s" in text
    assert "× = reference-bfp16/reference, the ratio of the medians" in text


def test_bench_numerics_plans_one_reference_row_per_numerics_and_refuses_other_names():
    pytest.importorskip("quark", reason="--numerics bfp16 needs amd-quark (raipack's build extra)")
    from raipack.benchmark import parse_numerics

    pkg = reference_package("reference-4K")
    plan = make_plan(pkg, [32], Runs(4, 1, 0), "reference", numerics=parse_numerics("float,bfp16"))
    assert [b for b, _ in plan.backends] == ["reference", "reference-bfp16"]
    with pytest.raises(UsageError, match="--numerics is 'fp8'; expected one of float, bfp16"):
        parse_numerics("float,fp8")


def test_an_npu_package_is_benched_under_the_device_numerics_by_default(tmp_path, monkeypatch):
    """Issue 39: without --numerics the reference backend runs a package of an NPU target as the device computes
    (BFP16), its rows with their ratio to the export; --numerics float keeps the float graph."""
    pytest.importorskip("quark", reason="the default bfp16 needs amd-quark (raipack's build extra)")
    from raipack.benchmark import parse_numerics

    monkeypatch.setenv("RAIPACK_CACHE", str(tmp_path / "empty-cache"))
    assert parse_numerics(None) is None
    plan = make_plan(reference_package("reference-4K"), [32], Runs(4, 1, 0), "reference")
    assert [b for b, _ in plan.backends] == ["reference-bfp16"]
    assert any("under bfp16 numerics, the device's" in n for n in plan.notes)
    assert [b for b, _ in make_plan(reference_package("reference-4K"), [32], Runs(4, 1, 0), "reference", numerics=["float"]).backends] == ["reference"]
    timings = {"bfp16": ([0.3] * 3, [10.0] * 3, 300.0), "float": ([0.1] * 3, [40.0] * 3, 100.0)}  # the oga job runs float
    fake = Plan(Path("pkg"), [256], 8, 3, 0, [("reference-bfp16", Path("pkg")), ("oga", Path("x"))], prompt_source={256: "prompts.txt"})
    doc = bench(fake, runner=fake_runner(timings, "numerics", []))
    assert [q["of"] for q in doc["ratios"]] == ["reference-bfp16/oga"] and doc["ratios"][0]["ttft"] == 3.0


def test_bench_bfp16_row_runs_for_real(capsys):
    pytest.importorskip("quark", reason="--numerics bfp16 needs amd-quark (raipack's build extra)")
    code, out, err = run_cli(capsys, "bench", reference_package("reference-4K"), "--backend", "reference", "--numerics", "float,bfp16",
                             "-l", "32", "-g", "4", "--runs", "1", "--warmup", "0", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    rows = {r["backend"]: r for r in doc["rows"]}
    assert set(rows) == {"reference", "reference-bfp16"}
    assert "bfp16 activations, BFP16 as Quark defines it; the NPU's exact arithmetic is not published" in rows["reference-bfp16"]["ran_on"]
    assert rows["reference-bfp16"]["tokens_per_s"]["median"] > 0 and doc["ratios"][0]["of"] == "reference-bfp16/reference"
