"""Issue 14's model families, built: a tiny model of each through every stage, for both NPU profiles.

Each family AMD publishes NPU packages of (tests/data/families.json: Qwen2.5, DeepSeek-R1-Distill-Qwen,
Qwen3, Mistral v0.1 with its sliding window and v0.3 without, Phi-4-mini, Gemma 3, and Llama-2 as the
guard of the Llama-shaped variants) is built by `raipack build` (the runner, in process) from a tiny
model with the real checkpoint's config shape, with AWQ, for 1.8.0-npu-16K and 1.8.0-npu-4K from one
model and one stage cache (quantize and export run once per family). The package must validate with
no finding at all; the smoke stage must show the reference runtime matching the unfused export at
every prefill tier up to 1024; a prompt crossing a chunk boundary (on a copy tuned to 256-token
chunks) and, for the sliding-window families, a prompt past the 192-token window must match too.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from helpers import build_once, locked
from raipack.builder.recipe import load
from raipack.builder.runner import build
from raipack.npu import profile as profiles
from raipack.validate import validate
from seed_models import FAMILY_PACKAGES, make_tiny_model, tiny_config
from shared_fixtures import TRAIN_TEXT

pytestmark = pytest.mark.seeds
FAMILIES = ["qwen2.5-1.5b", "deepseek-r1-distill-qwen-1.5b", "qwen3-1.7b", "mistral-7b-v0.1", "mistral-7b-v0.3",
            "phi-4-mini", "gemma-3-1b", "llama-2-7b"]
PROFILES = ["1.8.0-npu-16K", "1.8.0-npu-4K"]
SMOKE_MAX_TIER = 1024
# the tiny windows (192) the prefill tiers pass; Phi-4-mini's 262144 and Qwen's unused ones are no window
SLIDING = [f for f in FAMILIES if (tiny_config(f).get("sliding_window") or SMOKE_MAX_TIER) < SMOKE_MAX_TIER and tiny_config(f).get("use_sliding_window", True)]
CHUNK = 256  # a prefill tier of both profiles; the prompt below crosses it
TIMES_ENV = "RAIPACK_FAMILY_TIMES"  # a file to append each build's seconds to


def model_name(family: str) -> str:
    """The AMD folder name's model part (families.json `packages`)."""
    return next(name.split("_rai_")[0] for name, spec in FAMILY_PACKAGES.items() if spec["family"] == family)


def package_name(family: str, profile_id: str) -> str:
    return f"{model_name(family)}_rai_{profile_id.replace('-', '_')}"


# Known gaps, each failing until fixed (strict xfail) and then to be removed.
KNOWN: dict[tuple[str, str], str] = {}  # (family, profile) → why; none today


def by_family(cases, known: dict | None = None):
    """One xdist group per family (make test runs --dist loadgroup): its model and stage cache are built once."""
    return [pytest.param(*case, id="-".join(case), marks=[pytest.mark.xdist_group(case[0])] + (
        [pytest.mark.xfail(strict=True, reason=known[case])] if case in (known or {}) else [])) for case in cases]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(family, profile) → BuildResult, built on first use. The tiny model and the stage cache of a
    family are shared by the xdist workers (their temp folders' parent) under a lock per family, so
    quantize and export run once per family even where the scheduler splits a family's tests
    (pytest-xdist 3.8 here does not keep an xdist_group on one worker); packages go to each
    worker's own output folder."""
    out: dict = {}
    own = tmp_path_factory.getbasetemp()
    shared = own.parent / "families" if os.environ.get("PYTEST_XDIST_WORKER") else own / "families"

    def get(family: str, profile_id: str):
        if (family, profile_id) not in out:
            with locked(shared / f"{family}.lock"):
                start = time.perf_counter()
                model = build_once(shared / "models" / family, lambda partial: make_tiny_model(family, partial, train_steps=40))
                made = time.perf_counter() - start
                recipe = load(None, {"model": str(model), "name": model_name(family), "profile": profile_id,
                                     "output": str(own / "build"), "quantize.num_samples": 2, "quantize.seq_len": 64, "quantize.quality": False,
                                     "smoke.max_tier": SMOKE_MAX_TIER,
                                 "smoke.perplexity": False,  # the held-out perplexity (5 of a seed smoke's 8 s) is the smoke tests' and the e2e's
                                 "smoke.numerics": "float"})  # BFP16 (the NPU target's default) is the e2e's and tests/test_stages/test_smoke_numerics.py's
                out[family, profile_id] = result = build(recipe, cache_root=shared / "cache" / family)
            if os.environ.get(TIMES_ENV):  # docs/measurements/families.md: where a family's build time goes
                with open(os.environ[TIMES_ENV], "a") as fh:
                    fh.write(json.dumps({"family": family, "profile": profile_id, "model": round(made, 2),
                                         **{s.name: round(s.seconds, 2) for s in result.stages}}) + "\n")
        return out[family, profile_id]

    return get


def stage(result, name: str):
    return next(s for s in result.stages if s.name == name)


def prompt_ids(pkg: Path, n: int) -> list[int]:
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(pkg / "tokenizer.json")).encode(TRAIN_TEXT * 4).ids
    assert len(ids) >= n
    return ids[:n]


def matches_export(result, pkg: Path, prompt: list[int], new: int = 12):
    """(reference runtime tokens, export tokens, the runtime) for one prompt, the export chunked alike."""
    from raipack.runtime.ortloop import OrtDecoder
    from raipack.runtime.reference import ReferenceRuntime

    rt = ReferenceRuntime(pkg, threads=2)
    want, _ = OrtDecoder(Path(stage(result, "export").path), threads=2, logits_rows=True).greedy(prompt, new, chunk_size=rt.chunk_size if rt.chunked else None)
    return list(rt.generate(prompt, new)), list(want), rt


@pytest.mark.parametrize(("family", "profile_id"), by_family([(f, p) for f in FAMILIES for p in PROFILES], KNOWN))
def test_family_builds_validates_clean_and_matches_its_export(built, family, profile_id):
    result = built(family, profile_id)
    pkg = Path(result.package)
    assert pkg.name == package_name(family, profile_id)
    check = validate(pkg)
    assert check.profile == profiles.reference_for(profiles.get(profile_id)).id, check.profile_reason
    assert [(f.check_id, f.severity, f.message) for f in check.findings if f.severity in ("error", "warning", "advice")] == []
    assert not validate(pkg, profile_id).failed()

    smoke = stage(result, "smoke").report
    target = profiles.for_model(profiles.get(profile_id), tiny_config(family)["model_type"])
    assert smoke["device"] == "cpu-reference" and smoke["finite"] and smoke["tokens_match_export"]
    assert [t["tier"] for t in smoke["tiers"]] == [t for t in target.buckets.prefill if t <= SMOKE_MAX_TIER]
    assert all(t["tokens_match_export"] and t["finite"] for t in smoke["tiers"])

    quantize = stage(result, "quantize").report
    assert quantize["algorithm"] == "awq"
    awq = quantize["awq"]  # AWQ that scales nothing is round-to-nearest under AWQ's name
    assert awq["scaling_groups"] and awq["linears_scaled"] > 0
    assert all(g["decoder_layers_scaled"] == awq["decoder_layers"] for g in awq["scaling_groups"]), awq["scaling_groups"]


@pytest.mark.parametrize(("family", "profile_id"), by_family([(f, "1.8.0-npu-16K") for f in FAMILIES]))
def test_prompt_across_a_chunk_boundary_matches_the_export(built, family, profile_id, tmp_path):
    """A copy tuned by `raipack tune --chunk-size 256`; a 300-token prompt is two prefill calls."""
    from raipack import tune

    result = built(family, profile_id)
    pkg = tmp_path / Path(result.package).name
    shutil.copytree(result.package, pkg)
    plan = tune.plan(pkg, None, None, CHUNK)
    assert any(change[0] == "search.chunk_size" and change[2] == CHUNK for change in plan.changes), plan.changes
    tune.apply(plan)
    got, want, rt = matches_export(result, pkg, prompt_ids(pkg, 300))
    assert rt.chunk_size == CHUNK and len([c for c in rt.calls if c[0] == "prefill"]) == 2
    assert got == want


@pytest.mark.parametrize(("family", "profile_id"), by_family([(f, p) for f in SLIDING for p in PROFILES]))
def test_run_past_the_sliding_window_matches_the_export(built, family, profile_id):
    """The tiny models' window is 192 tokens: a 400-token prompt and its answer attend past it."""
    import onnx

    config = tiny_config(family)
    window = config["sliding_window"]
    result = built(family, profile_id)
    pkg = Path(result.package)
    got, want, rt = matches_export(result, pkg, prompt_ids(pkg, 400), new=16)
    assert rt.filled > 2 * window
    assert got == want
    # an answer whose own tokens cross the window (the token path, not the prefill's)
    got, want, rt = matches_export(result, pkg, prompt_ids(pkg, window - 40), new=80)
    assert got == want and rt.filled > window
    # every sliding layer keeps the window in the fused graph (GQA attends to `window` keys, the token
    # itself included, as transformers' mask), the global ones none: the smoke stage's export
    # comparison alone cannot see a window both lack
    pattern = config.get("sliding_window_pattern") or config["num_hidden_layers"] + 1  # Gemma 3: every 6th layer global
    local = [(i + 1) % pattern != 0 for i in range(config["num_hidden_layers"])]
    graph = onnx.load(str(pkg / "model.onnx"), load_external_data=False).graph
    windows = [next((a.i for a in n.attribute if a.name == "attn_local_window_size"), -1) for n in graph.node if n.op_type.startswith("GQA")]
    assert windows == [window if lo else -1 for lo in local]
    # and the export against transformers (the Quark model), over more tokens than the window
    parity = stage(result, "export").report["parity"]["perplexity"]
    assert parity["tokens"] > window and abs(parity["ratio"] - 1) < 1e-3, parity
    # the window is the check budget's ("auto": a tiny model gets the full one) and the report says so, for the smoke stage
    budget = stage(result, "export").report["check_budget"]
    assert budget["tokens"] == 256 >= parity["tokens"] and budget["scale"] == 1.0 and budget["basis"].startswith("auto: ")
    assert stage(result, "export").report["parity"]["steps"] == budget["answer_tokens"] == 16  # parity_steps "auto": the budget's answers
