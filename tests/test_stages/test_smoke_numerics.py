"""Issue 39: the smoke stage predicts the device's answer under the NPU's numerics by default.

For an NPU or hybrid target (and raipack's reference packages of them) the stage's answer to the fixed prompt
and its held-out perplexity run under BFP16 activations unless the recipe says `[smoke] numerics = "float"`;
the float run stays as the check of the fusion. The runs themselves are tests/test_pipeline/test_bfp16.py's
(the tiny package) and tests/test_e2e.py's (the example); these tests hold the choice and the checks."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from raipack.npu.target import Target


@pytest.mark.parametrize("target, expected", [(Target.NPU, "bfp16"), (Target.HYBRID, "bfp16"), (Target.REFERENCE, "bfp16"),
                                              (Target.MODEL_PACKAGE, "float"), (Target.INTERMEDIATE, "float"), (None, "float")])
def test_the_device_numerics_of_each_target(target, expected):
    from raipack.stages.smoke.device import target_numerics

    assert target_numerics(target) == expected


def test_unset_numerics_follow_the_target_and_the_recipe_can_pin_float(monkeypatch):
    from raipack.stages.smoke.device import numerics_of
    from raipack.stages.smoke.stage import SmokeConfig

    assert SmokeConfig().numerics is None  # unset: the target's
    npu = SimpleNamespace(target=Target.NPU)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: SimpleNamespace() if name == "quark" else real(name, *a))
    report: dict = {}
    assert numerics_of(SmokeConfig(), npu, report) == "bfp16" and report == {"numerics": "bfp16"}
    report = {}
    assert numerics_of(SmokeConfig(numerics="float"), npu, report) == "float" and report == {"numerics": "float"}
    assert numerics_of(SmokeConfig(), SimpleNamespace(target=Target.MODEL_PACKAGE), {}) == "float"


def test_without_quark_the_default_falls_back_to_float_and_says_so(monkeypatch):
    from raipack.stages.smoke.device import numerics_of
    from raipack.stages.smoke.stage import SmokeConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "quark" else real(name, *a))
    report: dict = {}
    assert numerics_of(SmokeConfig(), SimpleNamespace(target=Target.HYBRID), report) == "float"
    assert report["numerics"] == "float" and "amd-quark" in report["numerics_skipped"]


def test_an_expected_answer_missing_under_bfp16_is_said_not_failed():
    """The float answer is the stage's check; the BFP16 answer is a prediction (Quark's definition of the format):
    when it lacks the expected answer the stage says so in one line and the report's first screen shows both."""
    from raipack.stages.smoke.device import expected_missing
    from raipack.stages.smoke.stage import _problems

    good = {"answer": "Paris.", "numerics": "bfp16", "answer_bfp16": "It is Paris."}
    assert _problems(good, "Paris") == [] and expected_missing(good, "Paris") is None
    bad = dict(good, answer_bfp16="Ladies and gentlemen")
    assert _problems(bad, "Paris") == []
    assert expected_missing(bad, "Paris") == "the answer predicted under BFP16 'Ladies and gentlemen' does not contain 'Paris' (the float answer does)"
    assert expected_missing(dict(bad, numerics="float"), "Paris") is None and expected_missing(bad, None) is None


def test_the_recipe_takes_smoke_numerics_float_and_refuses_another_value():
    from raipack.builder.config import parse_config
    from raipack.builder.recipe import RecipeError, load
    from raipack.core.errors import UsageError
    from raipack.stages.smoke.stage import SmokeConfig

    assert load(None, {"smoke.numerics": "float"}).stages["smoke"] == {"numerics": "float"}
    assert parse_config(SmokeConfig, {"numerics": "float"}, "[smoke]").numerics == "float"
    with pytest.raises((RecipeError, UsageError)):
        parse_config(SmokeConfig, {"numerics": "int8"}, "[smoke]")


def test_the_stage_on_a_reference_package_predicts_the_device_under_bfp16_by_default():
    """The whole stage on the tiny reference package (target reference: an NPU package's stand-in), numerics
    unset: the float run checks the export token for token, the BFP16 run gives the answer and perplexity."""
    pytest.importorskip("quark", reason="BFP16 needs amd-quark (raipack's build extra)")
    import tempfile
    from pathlib import Path

    from factory import reference_export, reference_package
    from raipack.builder.progress import Progress
    from raipack.core.stage import Job
    from raipack.stages.smoke import stage

    cfg = stage.SmokeConfig(max_new_tokens=8, tiers="all", max_tier=1)
    job = Job(stage=stage.STAGE, config=cfg, inputs={"fuse": reference_package("reference-4K"), "export": reference_export()[0]},
              workdir=Path(tempfile.mkdtemp()), profile=SimpleNamespace(target=Target.REFERENCE),
              recipe=SimpleNamespace(model=None, expected_answer=None), progress=Progress("quiet"))
    report = stage.run(job)
    assert report["numerics"] == "bfp16" and report["tokens_match_export"] is True  # the float run still checks the fusion
    assert report["ppl_package_bfp16"] > 1 and report["ppl_package"] > 1 and report["ppl_package_bfp16"] != report["ppl_package"]
    assert isinstance(report["answer_bfp16"], str) and isinstance(report["numerics_changed_answer"], bool)
    assert 1 <= report["answer_bfp16_tokens"] <= 8  # max_new_tokens, or the export's check budget when shorter
    assert report["seconds_numerics"] > 0 and report["ttft_cold_s"] > 0 and "not published" in report["numerics_note"]
    assert report["summary"].startswith("cpu-reference (BFP16, predicted): ")
    assert {"numerics", "ppl_package_bfp16", "answer_bfp16", "numerics_changed_answer", "numerics_note"} <= set(report["quality"])


def test_the_bfp16_answer_is_the_budgets_length_and_compared_with_as_many_float_tokens(monkeypatch):
    """Below the full budget the BFP16 answer has the budget's answer_tokens (8 at Llama-3.1-8B), not the float
    answer's max_new_tokens; whether the numerics changed it compares it with the float answer's first tokens."""
    pytest.importorskip("quark", reason="BFP16 needs amd-quark (raipack's build extra)")
    import tempfile
    from pathlib import Path

    from factory import reference_export, reference_package
    from raipack.builder.progress import Progress
    from raipack.core.stage import Job
    from raipack.stages.smoke import device, stage

    monkeypatch.setattr(device, "export_answer_tokens", lambda export: 3)
    lengths = []
    real = device.device_run
    monkeypatch.setattr(device, "device_run", lambda *a: lengths.append(a[3].length) or real(*a))
    cfg = stage.SmokeConfig(max_new_tokens=8, tiers="all", max_tier=1, perplexity=False)
    job = Job(stage=stage.STAGE, config=cfg, inputs={"fuse": reference_package("reference-4K"), "export": reference_export()[0]},
              workdir=Path(tempfile.mkdtemp()), profile=SimpleNamespace(target=Target.REFERENCE),
              recipe=SimpleNamespace(model=None, expected_answer=None), progress=Progress("quiet"))
    report = stage.run(job)
    assert lengths == [3] and report["answer_bfp16_tokens"] <= 3 and report["tokens_match_export"] is True


@pytest.mark.parametrize(("float_tokens", "got", "changed"), [
    ([5, 6, 7, 9, 9, 9], [5, 6, 7], False),  # the same first three tokens: unchanged, however long the float answer
    ([5, 6, 8, 9], [5, 6, 7], True),
    ([5, 2, 7, 7], [5, 2], False),  # both stop at the EOS (id 2)
    ([5, 6], [5, 6, 7], True),
])
def test_numerics_changed_answer_compares_the_prediction_with_as_many_float_tokens(monkeypatch, float_tokens, got, changed):
    import contextlib

    from raipack.runtime import scoring
    from raipack.stages.smoke import device

    class Fake:
        eos_token_ids = {2}

        def __init__(self, *a, **k):
            pass

        def generate(self, ids, n, stop_at_eos=True):
            assert n == 3
            return got

    class Quiet:
        def task(self, *a, **k):
            return contextlib.nullcontext(lambda n=1: None)

    monkeypatch.setattr(scoring, "ScoringRuntime", Fake)
    tok = SimpleNamespace(decode=lambda ids, skip_special_tokens=True: " ".join(map(str, ids)))
    report = {"numerics": "bfp16", "answer": "whatever"}
    device.device_run(report, Path("."), tok, device.Asked([1, 2, 3], [], float_tokens, 3), SimpleNamespace(threads=None), Quiet())
    assert report["numerics_changed_answer"] is changed and report["answer_bfp16_tokens"] == len(got)
