"""`raipack eval` (issue 16): lm-eval-harness on the tiny reference build's export and package, the
accuracy chain and the build gate. Tasks are local folders this file writes (lm-eval's YAML + JSONL),
run offline; the models are the shared reference build (tests/factory.py), never a new Quark run.

The multiple-choice task is made from the export's own next-token ranking (the gold choice is its
argmax, the others its least likely words), so a correct loglikelihood scores 1.0 and an LM that
answers wrong scores 0.0: the gate's drop is real, not a coin toss of a random model.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from factory import reference_export, reference_package
from helpers import run_cli
from raipack.core.errors import RaipackError

pytest.importorskip("lm_eval", reason="lm-eval (raipack's eval extra) is not installed")
# one xdist worker for the module: its fixtures (the eval runs) are made once, and lm-eval's registry, which the
# unknown-task tests index (10 s of YAML), once a process (raipack.evaluation.tasks.registry_names)
pytestmark = pytest.mark.xdist_group("eval")

PACKAGE_PROFILE = "reference-4K"
ALL = ["tiny_mc", "tiny_roll", "tiny_gen"]
PROMPTS = ["Paris is the capital of", "The quick brown fox jumps over the", "Greedy decoding picks the token with the",
           "Quantization stores each weight in", "The tokenizer splits text into", "Every layer keeps a key and",
           "Rome is the capital of", "Small models are fast to"]
TEXTS = ["Berlin is the capital of Germany.", "The cache grows by one token per step.", "A four bit weight has a scale and a zero point."]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _words(tok, order) -> list[str]:
    """Token strings of `order` that are whole words with a leading space (no byte pieces)."""
    out = []
    for t in order:
        s = tok.decode([int(t)])
        if s.startswith(" ") and s[1:].isalpha() and s not in out:
            out.append(s)
    return out


def write_tasks(folder: Path, oga: Path) -> Path:
    from transformers import AutoTokenizer

    from raipack.runtime.ortloop import OrtDecoder

    tok, dec = AutoTokenizer.from_pretrained(str(oga)), OrtDecoder(oga)
    folder.mkdir(parents=True)
    mc = []
    for i, prompt in enumerate(PROMPTS):
        order = dec.logits(tok.encode(prompt, add_special_tokens=False))[-1].argsort()[::-1]
        best, worst = tok.decode([int(order[0])]), _words(tok, order[::-1])[:2]
        choices = worst[:]
        choices.insert(i % 3, best)
        mc.append({"q": prompt, "choices": choices, "label": i % 3})
    data = {"mc.jsonl": mc, "roll.jsonl": [{"text": t} for t in TEXTS],
            "gen.jsonl": [{"q": p, "a": tok.decode(dec.greedy(tok.encode(p, add_special_tokens=False), 1)[0])} for p in PROMPTS[:3]]}
    for name, docs in data.items():
        (folder / name).write_text("".join(json.dumps(d) + "\n" for d in docs))
    common = "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {file}\ntest_split: test\n"
    (folder / "mc.yaml").write_text("task: tiny_mc\n" + common.format(file="mc.jsonl") + 'output_type: multiple_choice\ndoc_to_text: "{{q}}"\n'
                                    'target_delimiter: ""\n'
                                    'doc_to_choice: "{{choices}}"\ndoc_to_target: label\nmetric_list:\n  - metric: acc\n')
    (folder / "roll.yaml").write_text("task: tiny_roll\n" + common.format(file="roll.jsonl") + 'output_type: loglikelihood_rolling\ndoc_to_text: ""\n'
                                      'doc_to_target: "{{text}}"\nmetric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n')
    (folder / "gen.yaml").write_text("task: tiny_gen\n" + common.format(file="gen.jsonl") + 'output_type: generate_until\ndoc_to_text: "{{q}}"\n'
                                     'doc_to_target: "{{a}}"\ngeneration_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 1\n'
                                     'metric_list:\n  - metric: exact_match\n')
    return folder


@pytest.fixture(scope="module")
def build_parts():
    oga, _ = reference_export()
    return oga, reference_package(PACKAGE_PROFILE)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory, build_parts):
    return write_tasks(tmp_path_factory.mktemp("eval-tasks") / "tasks", build_parts[0])


@pytest.fixture(scope="module")
def runs(tmp_path_factory, build_parts, tasks):
    """(export results from the API, package results from the CLI's --output file, the CLI's stdout)."""
    from raipack.evaluation.run import Request, evaluate

    oga, pkg = build_parts
    export = evaluate(oga, Request(ALL, include_path=tasks))
    out = tmp_path_factory.mktemp("eval-out") / "eval.json"
    res = run_cli(None, "eval", pkg, "--tasks", ",".join(ALL), "--include-path", tasks, "--numerics", "float", "-o", out)  # the float graph
    assert res.code == 0, res.out
    return export, json.loads(out.read_text()), res.out


def test_export_and_package_give_identical_scores(runs):
    export, package, _ = runs
    assert export["raipack"]["kind"] == "export" and package["raipack"]["kind"] == "package"
    assert package["raipack"]["ran_on"].startswith("cpu-reference") and "not the NPU" in package["raipack"]["ran_on"]
    assert export["results"]["tiny_mc"]["acc,none"] == 1.0  # the gold is the export's argmax: scoring is right
    for task, metric in (("tiny_mc", "acc,none"), ("tiny_gen", "exact_match,none")):
        assert package["results"][task][metric] == export["results"][task][metric], (task, metric)
    for metric in ("word_perplexity,none", "bits_per_byte,none"):  # functions of the summed loglikelihoods
        assert package["results"]["tiny_roll"][metric] == pytest.approx(export["results"]["tiny_roll"][metric], rel=1e-5)


def test_export_and_package_loglikelihoods_match_position_by_position(build_parts):
    """The package's rows come from one prefill and then token steps (its graph returns the last row only);
    the export's from one full-sequence call: the same numbers up to float rounding."""
    from raipack.evaluation.backends import ExportBackend, PackageBackend
    from raipack.evaluation.lm import log_softmax

    oga, pkg = build_parts
    ctx, cont = [5, 17, 42, 99, 7], [3, 250, 11, 64]
    a = log_softmax(ExportBackend(oga).rows(ctx, cont))
    b = log_softmax(PackageBackend(pkg, "test").rows(ctx, cont))
    assert a.shape == b.shape == (len(cont), a.shape[-1])
    np.testing.assert_allclose(a, b, atol=2e-4)


def test_result_file_is_lm_eval_format_and_the_table_names_the_backend(runs):
    _, package, stdout = runs
    for key in ("results", "configs", "versions", "n-shot", "higher_is_better", "n-samples"):
        assert key in package, key
    assert set(package["results"]) == set(ALL)
    assert package["configs"]["tiny_mc"]["output_type"] == "multiple_choice"
    assert "acc_stderr,none" in package["results"]["tiny_mc"]
    assert {"target", "kind", "ran_on"} <= set(package["raipack"])
    lines = stdout.splitlines()
    assert any(line.split()[:2] == ["tiny_mc", "acc"] for line in lines)
    assert any(line.startswith("ran on: cpu-reference") for line in lines)


def _bad(tmp_path, tasks, yaml_text, name="bad.yaml"):
    folder = tmp_path / "bad-tasks"
    shutil.copytree(tasks, folder)
    (folder / name).write_text(yaml_text)
    return folder


@pytest.mark.parametrize("case, expect", [
    ("unknown-task", "task 'no_such_task' is not in lm-eval's registry or the task folder"),
    ("not-a-mapping", "bad.yaml is not an lm-eval task file: expected a mapping"),
    ("no-task-name", "bad.yaml is not an lm-eval task file: it has no 'task' name"),
    ("bad-output-type", "bad.yaml: output_type is 'ranking'; expected one of"),
    ("python-function", "bad.yaml, line 3: the tag !function is not allowed in a task file"),
    ("data-outside", "dataset_kwargs.data_files.test '../x.jsonl' leads outside the task folder"),
    ("template-code", "a template of tasks tiny_mc is not allowed"),  # rendered in jinja2's sandbox, not lm-eval's plain Environment
    ("not-a-target", "is none of the folders raipack eval runs"),
])
def test_bad_input_is_one_sentence_exit_2_and_nothing_written(tmp_path, tasks, build_parts, case, expect):
    yaml_text = {"not-a-mapping": "- task: x\n", "no-task-name": "dataset_path: json\n",
                 "bad-output-type": "task: t\ndataset_path: json\noutput_type: ranking\n",
                 "python-function": "task: t\ndataset_path: json\nprocess_docs: !function utils.process\n",
                 "data-outside": "task: t\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: ../x.jsonl\n"}.get(case)
    if case == "template-code":  # the real task with a doc_to_text that reaches os through a global and writes a file
        yaml_text = (tasks / "mc.yaml").read_text().replace('doc_to_text: "{{q}}"', "doc_to_text: \"{{ cycler.__init__.__globals__.os.system('touch ' ~ q|length ~ '.pwned') }}\"")
        assert yaml_text != (tasks / "mc.yaml").read_text()
    folder = _bad(tmp_path, tasks, yaml_text, "mc.yaml" if case == "template-code" else "bad.yaml") if yaml_text else tasks
    (tmp_path / "x.jsonl").write_text("{}\n")
    target = tmp_path if case == "not-a-target" else build_parts[1]
    out = tmp_path / "out.json"
    res = run_cli(None, "eval", target, "--tasks", "no_such_task" if case == "unknown-task" else "tiny_mc", "--include-path", folder, "-o", out)
    assert res.code == 2, res.err
    assert expect in res.err
    assert res.err.count("ERROR:") == 1 and "Traceback" not in res.err and res.out == ""
    assert not out.exists() and not list(tmp_path.rglob("*.pwned")) and not list(Path.cwd().glob("*.pwned"))


def _fake_build(tmp_path: Path, build_parts, source: Path) -> Path:
    """A build's output folder as raipack leaves it: the package and <package>.stages/<stage> links."""
    oga, pkg = build_parts
    _, quark = reference_export()
    out = tmp_path / "build"
    links = out / f"{pkg.name}.stages"
    links.mkdir(parents=True)
    shutil.copytree(pkg, out / pkg.name)
    for name, path in (("source", source), ("quantize", quark), ("export", oga), ("fuse", pkg)):
        os.symlink(path, links / name)
    return out


def _float_source(folder: Path, oga: Path) -> Path:
    """A float Llama with the build's tokenizer (the tiny build has no float source of its own)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(oga))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=256)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_chain_finds_every_stage_and_prints_the_drops(tmp_path, build_parts, tasks):
    """The quantize stage's Quark folder is scored through a stand-in LM here (the export's): reloading
    it through transformers imports amd-quark, about 20 s on this machine; its detection is real."""
    from raipack.evaluation.backends import ExportBackend
    from raipack.evaluation.chain import chain_table, run_chain, stage_outputs
    from raipack.evaluation.lm import RaipackLM
    from raipack.evaluation.run import Request
    from raipack.evaluation.targets import detect_target
    from raipack.runtime.chat import load_tokenizer

    oga, pkg = build_parts
    build_dir = _fake_build(tmp_path, build_parts, _float_source(tmp_path / "src", oga))
    outputs = stage_outputs(build_dir)
    assert list(outputs) == ["source", "quantize", "export", "fuse"]
    assert [detect_target(p).kind for p in outputs.values()] == ["source", "quark", "export", "package"]
    assert outputs["fuse"] == (build_dir / pkg.name).resolve()  # the package itself stands for its fuse stage
    assert stage_outputs(build_dir / pkg.name) == outputs  # the package leads to the same chain
    stand_in = RaipackLM(ExportBackend(oga), load_tokenizer(oga))
    doc = run_chain(outputs, Request(["tiny_mc"], include_path=tasks, numerics="float"), lms={"quantize": stand_in})  # the BFP16 link: the gate tests'
    chain = doc["raipack"]["chain"]
    assert [r["stage"] for r in chain] == ["source", "quantize", "export", "fuse"]
    assert [r["kind"] for r in chain] == ["source", "quark", "export", "package"]
    assert chain[0]["ran_on"].startswith("cpu (transformers")
    src, exp, fused = (chain[i]["drop"]["tiny_mc"]["acc,none"] for i in (0, 2, 3))
    assert exp["value"] == fused["value"] == 1.0 and fused["vs_previous"] == 0.0
    assert exp["vs_source"] == pytest.approx(src["value"] - 1.0)
    table = chain_table(doc).splitlines()
    assert [line.split()[0] for line in table[1:]] == ["source", "quantize", "export", "fuse"]


class _Wrong:
    """A backend that answers wrong: the negated logits of the real one (argmax becomes argmin)."""

    def __init__(self, real):
        self.real, self.max_length, self.ran_on = real, real.max_length, real.ran_on
        self.max_prompt = getattr(real, "max_prompt", None)

    def rows(self, context, continuation):
        return -self.real.rows(context, continuation)

    def generate(self, ids, n):
        return self.real.generate(ids, n)


def _copier(src: Path):
    def run(job):
        shutil.copytree(src, job.workdir, dirs_exist_ok=True, ignore=shutil.ignore_patterns("manifest.json"))
        return {"summary": f"copy of {src.name}"}
    return run


@pytest.fixture
def gated_env(tmp_path, monkeypatch, build_parts):
    """Stages that copy the reference build's real outputs (the export stands in for the source and the
    Quark model, which would load through amd-quark); the fuse stage's is a real runnable package."""
    import dataclasses

    import fake_stages
    from raipack.core.stage import Stage

    oga, pkg = build_parts
    fakes = {name: Stage(name, "1", fake_stages.FakeConfig, inputs, lambda j: None, _copier(oga), kind=kind)
             for name, inputs, kind in (("source", (), "source"), ("quantize", ("source",), "quark"), ("export", ("quantize",), "oga"))}
    fakes["fuse"] = dataclasses.replace(fakes["export"], name="fuse", inputs=("export",), run=_copier(pkg), kind="package")
    fakes["smoke"] = fake_stages.FAKES["smoke"]
    monkeypatch.setenv("RAIPACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("raipack.builder.stages.get", fakes.__getitem__)
    monkeypatch.setattr(fake_stages, "CALLS", tmp_path / "calls.txt")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_gate_refuses_a_build_whose_drop_is_over_max_drop(gated_env, tasks, monkeypatch):
    from raipack.builder.recipe import load
    from raipack.builder.runner import build
    from raipack.evaluation import backends

    real_open = backends.open_backend
    monkeypatch.setattr(backends, "open_backend", lambda t, numerics="float": _Wrong(real_open(t)) if t.kind == "package" else real_open(t))
    recipe = load(None, {"output": "build", "profile": "1.8.0-npu-4K", "eval": {"tasks": ["tiny_mc"], "include_path": str(tasks), "max_drop": 0.05}})
    with pytest.raises(RaipackError) as err:
        build(recipe)
    assert str(err.value) == "accuracy gate: tiny_mc acc drops by 1.0000 from the source to the fuse stage, over max_drop 0.05"
    assert err.value.exit_code != 0
    out = gated_env / "build"
    assert not (out / "SmolLM2-135M-Instruct_rai_1.8.0_npu_4K").exists()  # no package that looks finished
    assert not [p for p in out.iterdir() if ".staging-" in p.name]
    kept = json.loads((out / "SmolLM2-135M-Instruct_rai_1.8.0_npu_4K.stages" / "eval.json").read_text())
    assert kept["raipack"]["gate"] == {"max_drop": 0.05, "passed": False}


def test_gate_passes_and_the_package_carries_its_results(gated_env, tasks):
    from raipack.builder.recipe import load
    from raipack.builder.runner import build

    recipe = load(None, {"output": "build", "profile": "1.8.0-npu-4K", "eval": {"tasks": ["tiny_mc"], "include_path": str(tasks), "max_drop": 0.0}})
    result = build(recipe)
    report = json.loads((result.package / "report.json").read_text())
    evaluation = json.loads((result.package / "eval.json").read_text())
    assert report["eval"] == evaluation and evaluation["raipack"]["gate"] == {"max_drop": 0.0, "passed": True}
    bfp16 = ["fuse (bfp16)"] if importlib.util.find_spec("quark") else []  # issue 39: the NPU package's device numerics by default, gated too
    assert [r["stage"] for r in evaluation["raipack"]["chain"]] == ["source", "quantize", "export", "fuse", *bfp16]
    assert "eval.json" in {f["path"] for f in json.loads((result.package / "manifest.json").read_text())["files"]}


def test_a_recipe_naming_an_unknown_task_is_refused_before_any_stage_runs(gated_env, tasks):
    from raipack.builder.recipe import load
    from raipack.builder.runner import build
    from raipack.core.errors import UsageError

    with pytest.raises(UsageError, match="task 'nope' is not in lm-eval's registry or the task folder"):
        build(load(None, {"output": "build", "eval": {"tasks": ["nope"], "include_path": str(tasks)}}))
    assert not (gated_env / "cache").exists() or not any((gated_env / "cache").rglob("manifest.json"))


# ------------------------------------------------------------------ --numerics bfp16 (issue 26)


def test_eval_of_an_npu_package_reports_the_float_and_bfp16_rows_side_by_side_by_default(runs, build_parts, tasks, tmp_path):
    """Issue 39: without --numerics, a package of an NPU target is scored as the device computes (BFP16),
    beside the float graph (the drop's reference); issue 26's --numerics bfp16 gives the same rows."""
    pytest.importorskip("quark", reason="--numerics bfp16 needs amd-quark (raipack's build extra)")
    _, package_float, _ = runs
    out = tmp_path / "eval.json"
    res = run_cli(None, "eval", build_parts[1], "--tasks", "tiny_mc,tiny_roll", "--include-path", tasks, "-o", out)
    assert res.code == 0, res.err
    doc = json.loads(out.read_text())
    rows = doc["raipack"]["rows"]
    assert [r["numerics"] for r in rows] == ["float", "bfp16"]
    assert "bfp16 activations: BFP16 as Quark defines it; the NPU's exact arithmetic is not published" in rows[1]["ran_on"]
    ppl = "word_perplexity,none"
    assert rows[0]["results"]["tiny_roll"][ppl] == pytest.approx(package_float["results"]["tiny_roll"][ppl], rel=1e-6)  # the float row is the plain run
    assert rows[1]["results"]["tiny_roll"][ppl] != rows[0]["results"]["tiny_roll"][ppl]  # BFP16 changes the scores
    drop = rows[1]["drop"]["tiny_roll"][ppl]
    assert drop["vs_source"] == pytest.approx(rows[1]["results"]["tiny_roll"][ppl] - rows[0]["results"]["tiny_roll"][ppl], abs=1e-5)
    lines = res.out.splitlines()
    assert lines[0].split() == ["task", "metric", "float", "bfp16", "drop"]
    assert any(line.split()[:2] == ["tiny_roll", "word_perplexity"] for line in lines)
    assert "note: BFP16 as Quark defines it; the NPU's exact arithmetic is not published" in res.out
    assert any(line.startswith("ran on (bfp16): cpu-reference") for line in lines)


def test_eval_bfp16_on_an_export_is_one_sentence_exit_2(build_parts, tasks):
    res = run_cli(None, "eval", build_parts[0], "--tasks", "tiny_mc", "--include-path", tasks, "--numerics", "bfp16")
    assert res.code == 2 and res.err.count("ERROR:") == 1
    assert "--numerics bfp16 applies to packages" in res.err and "export folder" in res.err


def test_gate_holds_the_bfp16_row_to_max_drop(gated_env, tasks, monkeypatch):
    """A package whose float scores are perfect but whose BFP16 run answers wrong: the bfp16 row fails the gate."""
    pytest.importorskip("quark", reason="numerics = bfp16 needs amd-quark (raipack's build extra)")
    from raipack.builder.recipe import load
    from raipack.builder.runner import build
    from raipack.evaluation import backends

    real_open = backends.open_backend
    monkeypatch.setattr(backends, "open_backend", lambda t, numerics="float": _Wrong(real_open(t, numerics)) if numerics == "bfp16" else real_open(t, numerics))
    recipe = load(None, {"output": "build", "profile": "1.8.0-npu-4K",
                         "eval": {"tasks": ["tiny_mc"], "include_path": str(tasks), "max_drop": 0.05, "numerics": "bfp16"}})
    with pytest.raises(RaipackError) as err:
        build(recipe)
    assert str(err.value) == "accuracy gate: tiny_mc acc drops by 1.0000 from the source to the fuse (bfp16) stage, over max_drop 0.05"
    out = gated_env / "build"
    assert not (out / "SmolLM2-135M-Instruct_rai_1.8.0_npu_4K").exists()  # no package that looks finished
    kept = json.loads((out / "SmolLM2-135M-Instruct_rai_1.8.0_npu_4K.stages" / "eval.json").read_text())
    assert [r["stage"] for r in kept["raipack"]["chain"]] == ["source", "quantize", "export", "fuse", "fuse (bfp16)"]
    assert kept["raipack"]["chain"][3]["drop"]["tiny_mc"]["acc,none"]["vs_source"] <= 0.05  # the float package passed
