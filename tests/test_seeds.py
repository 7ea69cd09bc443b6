"""The seed packages, built (issue 7): a tiny model of each seed family through every stage.

Each of the five packages the project started from is built by `raipack build` from a tiny random
model with its family's exact config shape (tests/seed_models.py: real rope settings, vocabulary,
tied or untied head, head-count ratio; 2 layers) for the seed's profile, under the seed's own folder
name. The package must validate clean, carry the release's options and tiers, and its reference run
must match the unfused export token for token — at every prefill tier (the smoke stage), across the
first KV window, and for the 16K packages with a prompt longer than the original 4K rope window.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from raipack.builder.recipe import load
from raipack.builder.runner import build
from raipack.npu import profile as profiles
from raipack.npu.genai import ryzenai_options
from raipack.validate import validate
from seed_models import FAMILIES, PACKAGES, make_tiny_model
from shared_fixtures import TRAIN_TEXT

pytestmark = pytest.mark.seeds
MODELS: dict[str, Path] = {}
SMOKE_MAX_TIER = 1024  # the smoke stage's tier prompts up to here; the long-prompt test below goes past 4096


def by_family(names):
    """One xdist group per family (make test runs --dist loadgroup): its model and stage cache are built once."""
    return [pytest.param(n, marks=pytest.mark.xdist_group(PACKAGES[n]["family"])) for n in names]


def model_name(package: str) -> str:
    return package.split("_rai_")[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """package name → BuildResult, built on first use (models shared by family)."""
    out: dict = {}
    root = tmp_path_factory.mktemp("seeds")

    def get(name: str):
        if name not in out:
            spec = PACKAGES[name]
            family = spec["family"]
            if family not in MODELS:
                MODELS[family] = make_tiny_model(family, root / "models" / family)
            recipe = load(None, {"model": str(MODELS[family]), "name": model_name(name), "profile": spec["profile"],
                                 "output": str(root / "build"), "quantize.num_samples": 4, "quantize.seq_len": 64, "quantize.quality": False,
                                 "smoke.max_tier": SMOKE_MAX_TIER,
                                 "smoke.perplexity": False,  # the held-out perplexity (5 of a seed smoke's 8 s) is the smoke tests' and the e2e's
                                 "smoke.numerics": "float"})  # BFP16 (the NPU target's default) is the e2e's and tests/test_stages/test_smoke_numerics.py's
            out[name] = build(recipe, cache_root=root / "cache")
        return out[name]

    return get


def stage(result, name: str):
    return next(s for s in result.stages if s.name == name)


@pytest.mark.parametrize("name", by_family(sorted(PACKAGES)))
def test_seed_package_builds_validates_and_matches_its_export(built, name):
    result = built(name)
    spec = PACKAGES[name]
    family = FAMILIES[spec["family"]]["config"]
    target = profiles.for_model(profiles.reference_for(profiles.get(spec["profile"])), family["model_type"])  # what raipack builds
    pkg = Path(result.package)
    assert pkg.name == name  # AMD's folder name pattern

    check = validate(pkg)
    assert check.profile == profiles.reference_for(profiles.get(spec["profile"])).id, check.profile_reason
    assert [f for f in check.findings if f.severity in ("error", "warning")] == []
    assert not validate(pkg, spec["profile"]).failed()  # and as AMD's release profile (only raipack's .plan files are extra)

    genai = json.loads((pkg / "genai_config.json").read_text())
    opts, _ = ryzenai_options(genai)
    search = genai["search"]
    assert search["max_length"] == target.genai.search["max_length"]
    assert search.get("chunk_size") == target.genai.search.get("chunk_size")
    assert opts["hybrid_opt_token_backend"] == "npu" and opts["external_data_file"] == "model.pb.bin"
    want_seq = {"{npu_seq}": max(target.buckets.prefill), "{max_length_pow2}": search["max_length"]}[target.genai.options["hybrid_opt_max_seq_length"].build]
    assert opts["hybrid_opt_max_seq_length"] == str(want_seq)
    if "max_length_for_kv_cache" in target.genai.options:
        assert opts["max_length_for_kv_cache"] == str(search["max_length"])
    rai = json.loads((pkg / "rai_config.json").read_text())
    assert rai["max_prompt_length"][target.release] == 4096

    cfg = json.loads((pkg / "config.json").read_text())
    for key in ("vocab_size", "num_key_value_heads", "num_attention_heads", "tie_word_embeddings", "rope_scaling", "rope_theta"):
        assert cfg[key] == {**family, **FAMILIES[spec["family"]]["tiny"]}[key], key
    assert cfg["quantization_config"]["quant_method"] == "quark"

    smoke = stage(result, "smoke").report
    assert smoke["device"] == "cpu-reference" and smoke["finite"] and smoke["tokens_match_export"]
    assert [t["tier"] for t in smoke["tiers"]] == [t for t in target.buckets.prefill if t <= SMOKE_MAX_TIER]
    assert all(t["tokens_match_export"] and t["finite"] for t in smoke["tiers"])
    assert smoke["overlong_prompt_refused"]


LONG = [n for n in sorted(PACKAGES) if profiles.get(PACKAGES[n]["profile"]).context > 4096]


@pytest.mark.parametrize("name", by_family(LONG))
def test_long_prompt_beyond_the_4k_rope_window_matches_the_export(built, name, tmp_path):
    """Ryzen AI 1.8 caps prompts at 4096 tokens (rai_config.json); the 16K mechanics — chunked
    prefill over the 16K KV buffer, LongRoPE switching to its long factors past 4096 positions — are
    run beyond it on a copy whose cap is raised, against the export run the same way."""
    from raipack.runtime.ortloop import OrtDecoder
    from raipack.runtime.reference import ReferenceRuntime

    result = built(name)
    pkg = tmp_path / name
    shutil.copytree(result.package, pkg)
    release = profiles.get(PACKAGES[name]["profile"]).release
    (pkg / "rai_config.json").write_text(json.dumps({"max_prompt_length": {release: 6000}}))
    rt = ReferenceRuntime(pkg, threads=2)
    export = OrtDecoder(Path(stage(result, "export").path), threads=2, logits_rows=True)  # greedy computes the rows it reads
    chunk = rt.chunk_size
    from tokenizers import Tokenizer

    prompt = Tokenizer.from_file(str(pkg / "tokenizer.json")).encode(TRAIN_TEXT * 40).ids[:5000]
    assert len(prompt) > 4096 >= FAMILIES[PACKAGES[name]["family"]]["config"].get("original_max_position_embeddings", 4096)
    want, _ = export.greedy(prompt, 12, chunk_size=chunk)
    got = rt.generate(prompt, 12)
    assert list(got) == list(want)
    prefills = [c for c in rt.calls if c[0] == "prefill"]
    assert len(prefills) == -(-len(prompt) // chunk)  # chunked like the runtime on the NPU would
    # a prompt inside the window whose generation crosses position 4096
    near = prompt[:4090]
    want, _ = export.greedy(near, 16, chunk_size=chunk)
    assert list(rt.generate(near, 16)) == list(want)
