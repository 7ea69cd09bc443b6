"""Fuse stage, reference backend: the fused package, its formats, its runtime and its checks.

The model is tests/shared_fixtures.py's tiny Quark export (2 layers, hidden 256, uint4 g128, lm_head float),
exported by the OGA builder with a 16384-position context so both reference profiles apply as they
are. Parity is against the plain onnxruntime loop over the unfused export (pipeline/runtime/ortloop.py, itself
checked against onnxruntime-genai): 64 greedy tokens identical and logits within 1e-3, at a prompt
length inside every prefill tier, across a token-tier boundary and through chunked prefill.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from raipack.npu import formats
from raipack.npu.profile import changed
from raipack.npu.spec import build
from shared_fixtures import TRAIN_TEXT

STEPS = 64
TOL = 1e-3


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def oga16k(tiny_quark, tmp_path_factory) -> Path:
    """The tiny Quark export with a 16K context, exported with the OGA builder (int4, cpu)."""
    from raipack.stages.export.builder import export

    root = tmp_path_factory.mktemp("fuse-oga")
    quark = root / "quark"
    shutil.copytree(tiny_quark.quark_dir, quark)
    cfg = json.loads((quark / "config.json").read_text())
    cfg["max_position_embeddings"] = 16384
    (quark / "config.json").write_text(json.dumps(cfg, indent=2))
    export(quark, root / "oga")
    return root / "oga"


@pytest.fixture(scope="session")
def packages(oga16k, tmp_path_factory) -> dict:
    """profile id → (package folder, fuse report); .gitattributes and manifest written as the runner's assembler writes them."""
    from factory import write_manifest
    from raipack.core import lfs
    from raipack.npu.profile import get as get_profile
    from raipack.stages.fuse.reference import fuse

    root = tmp_path_factory.mktemp("fuse-pkg")
    out = {}
    for pid in ("reference-4K", "reference-16K"):
        pkg = root / pid
        report = fuse(oga16k, pkg, get_profile(pid), quark_dir=oga16k.parent / "quark")
        lfs.write(pkg)
        write_manifest(pkg, target_profile=get_profile(pid).extends)
        out[pid] = (pkg, report)
    return out


@pytest.fixture(scope="session")
def prompt_ids(oga16k):
    from tokenizers import Tokenizer

    base = Tokenizer.from_file(str(oga16k / "tokenizer.json")).encode(TRAIN_TEXT).ids

    def make(n: int) -> list[int]:
        return (base * (n // len(base) + 1))[:n]

    return make


@pytest.fixture(scope="session")
def reference(oga16k):
    """greedy(prompt) → (tokens, logits rows) of the unfused export, cached per prompt."""
    from raipack.runtime.ortloop import OrtDecoder

    dec = OrtDecoder(oga16k, threads=2)
    cache = {}

    def greedy(prompt, steps=STEPS):
        key = (tuple(prompt), steps)
        if key not in cache:
            cache[key] = dec.greedy(prompt, steps)
        return cache[key]

    return greedy


@pytest.fixture(scope="session")
def runtimes(packages):
    from raipack.runtime.reference import ReferenceRuntime

    return {pid: ReferenceRuntime(pkg, threads=2) for pid, (pkg, _) in packages.items()}


def _copy(pkg: Path, tmp_path: Path) -> Path:
    dst = tmp_path / pkg.name
    shutil.copytree(pkg, dst)
    return dst


def _validate(pkg: Path, **kw):
    from raipack.validate import validate

    return validate(pkg, **kw)


def _ids(result) -> set[str]:
    return {f.check_id for f in result.findings}


def _assert_parity(rt, reference, prompt, steps: int = STEPS):
    want_tokens, want_rows = reference(prompt, steps)
    rt.calls.clear()
    tokens, rows = rt.generate(prompt, steps, return_logits=True)
    assert tokens == want_tokens
    assert np.abs(rows[0] - want_rows[0]).max() <= TOL  # last prompt token
    assert max(np.abs(a - b).max() for a, b in zip(rows, want_rows)) <= TOL
    return rt.calls


# ------------------------------------------------------------------------------------ the package


@pytest.mark.parametrize("pid", ["reference-4K", "reference-16K"])
def test_package_layout_and_report(packages, pid):
    pkg, report = packages[pid]
    from raipack.npu.profile import get as get_profile

    profile = get_profile(pid)
    assert report["findings"] == [] and report["npu_complete"]
    assert report["fused_counts"] == {"RMSNormQKV": 1, "SkipRMSNormQKV": 1, "GQARope": 2, "OProjSkipRMSNorm": 2, "SiluGatedMLP": 2}
    for name in profile.files.required:
        assert (pkg / name).is_file(), name
    genai = json.loads((pkg / "genai_config.json").read_text())
    opts = genai["model"]["decoder"]["session_options"]["provider_options"][0]["RyzenAI"]
    assert opts["external_data_file"] == "model.pb.bin" and opts["hybrid_opt_token_backend"] == "npu"
    assert opts["hybrid_opt_max_seq_length"] == str(max(profile.buckets.prefill))
    assert all(isinstance(v, str) for v in opts.values())
    search = genai["search"]
    assert search["max_length"] == profile.genai.search["max_length"] and search["past_present_share_buffer"] is True
    assert search.get("chunk_size") == profile.genai.search.get("chunk_size")
    tiers = [p.name for p in pkg.glob("dd_metastate_*.plan")]
    want = len([t for t in profile.buckets.prefill if t <= search["max_length"]]) + len(profile.buckets.token)
    assert len(tiers) == want
    assert json.loads((pkg / "config.json").read_text())["quantization_config"]["quant_method"] == "quark"
    rai = json.loads((pkg / "rai_config.json").read_text())["max_prompt_length"]
    assert rai["1.8.0"] == 4096 and rai["1.5.1"] == 2048
    assert "NOT loadable by AMD's proprietary" in (pkg / "README.md").read_text()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (pkg / name).is_file(), name
    assert not list(pkg.parent.glob(".*staging*"))


def test_fused_graph_has_functions_and_weights_split(packages):
    import onnx

    pkg, _ = packages["reference-4K"]
    model = onnx.load(str(pkg / "model.onnx"), load_external_data=False)
    fused = [n for n in model.graph.node if n.domain == "ai.raipack"]
    assert len(fused) == 8
    assert {f.name for f in model.functions} == {n.op_type for n in fused}
    assert all(f.domain == "ai.raipack" for f in model.functions)
    assert not [n for n in model.graph.node if n.op_type in ("MatMulNBits", "GroupQueryAttention")]
    where = {}
    for t in model.graph.initializer:
        where[t.name] = {e.key: e.value for e in t.external_data}["location"]
    assert where["lm_head.MatMul.weight"] == "model.onnx.data"  # float lm_head and the tied embedding: CPU side
    assert where["model.layers.2.final_norm_layernorm.weight"] == "model.onnx.data"
    assert where["model.layers.0.attn.qkv_proj.MatMulNBits.qweight"] == "model.bin"
    assert where["model.layers.1.mlp.down_proj.MatMulNBits.qzeros"] == "model.bin"


def test_header_indexes_model_bin(packages):
    pkg, _ = packages["reference-16K"]
    header = formats.read_header(pkg / "model.pb.bin")
    size = (pkg / "model.bin").stat().st_size
    assert formats.header_problems(header, size) == []
    assert header["weights_size"] == size and header["alignment"] == 4096
    entries = [t for _, _, _, t in formats.header_tensors(header)]
    assert all(t["offset"] % 4096 == 0 for t in entries)
    roles = {t["role"] for t in entries}
    assert {"qkv.B", "qkv.scales", "qkv.zero_points", "norm.scale", "attn.cos_cache", "down.B"} <= roles
    cos = next(t for t in entries if t["role"] == "attn.cos_cache")
    assert cos["shape"][0] == header["tiers"]["max_length"]  # rotary table cut to max_length
    wf = formats.WeightsFile(pkg / "model.pb.bin")  # sha256 of every tensor checked
    q = wf.array("model.layers.0.attn.qkv_proj.MatMulNBits.qweight")
    assert q.dtype == np.uint8 and list(q.shape) == [512, 2, 64]


def test_cache_meta_files_pass_schema_and_name_consts(packages):
    from raipack.core import schemas

    pkg, report = packages["reference-4K"]
    metas = sorted((pkg / "cache").glob("*_meta.json"))
    assert len(metas) == len(report["fused_nodes"])
    for meta_path in metas:
        meta = json.loads(meta_path.read_text())
        assert schemas.errors("cache_meta", meta) == []
        assert (meta["dd_meta_major_version"], meta["dd_meta_minor_version"]) == (1, 4)
        desc = meta["tensor_map"]["descriptor"]
        const = pkg / "cache" / desc["file_name"]
        assert const.stat().st_size == desc["file_size"]
        assert formats.decode_const(const.read_bytes())["node"] == meta["raipack"]["node"]


def _schedule(pkg: Path, phase: str):
    from raipack.npu import plans

    raw = (pkg / plans.schedule_rel("decoder", phase)).read_bytes()
    return json.loads(raw), formats.sha256_hex(raw)


def test_plans_follow_schema_and_never_overlap(packages):
    from raipack.core import schemas
    from raipack.npu import plans

    pkg, _ = packages["reference-16K"]
    prepared = {}
    for phase in ("prefill", "token"):
        doc, sha = _schedule(pkg, phase)
        assert schemas.errors("metastate_schedule", doc) == [] and plans.schedule_problems(doc, phase=phase, node="decoder") == []
        assert any(d in ("S", "T") for t in doc["tensors"].values() for d in t["shape"])  # shapes are shared symbolically
        prepared[phase] = (plans.Schedule(doc), sha)
    for plan_path in sorted(pkg.glob("dd_metastate_*.plan")):
        plan = json.loads(plan_path.read_text())
        assert schemas.errors("metastate_plan", plan) == [], plan_path.name
        phase = "prefill" if "_Prefill_" in plan_path.name else "token"
        tier = int(plan_path.stem.rsplit("_", 1)[1])
        sched, sha = prepared[phase]
        assert plan["format_version"] == plans.PLAN_VERSION and plan["schedule"] == {"file": plans.schedule_rel("decoder", phase), "sha256": sha}
        assert plans.plan_problems(plan, sched, phase=phase, tier=tier) == []
        assert sched.shape_at(plan["io"]["input_ids"], plan["sequence_length"], plan["kv_window"]) == [1, tier if phase == "prefill" else 1]
        assert plan_path.stat().st_size < 20_000  # what varies only; the schedule is stored once per phase
    # a corrupted plan: two buffers live at once moved onto each other
    plan = json.loads((pkg / "dd_metastate_Llm_Prefill_decoder_128.plan").read_text())
    sched = prepared["prefill"][0]
    sizes, offsets = plan["arena"]["sizes"], plan["arena"]["offsets"]
    i, j = next((i, j) for i, j in sched.pairs if sizes[i] and sizes[j])
    offsets[j] = offsets[i]
    assert any("overlap" in m for _, m in plans.plan_problems(plan, sched, phase="prefill", tier=128))
    # a buffer too small for its tensor at this tier, and a KV binding of another window
    tier = min(int(p.stem.rsplit("_", 1)[1]) for p in pkg.glob("dd_metastate_Llm_Token_*.plan"))
    plan = json.loads((pkg / f"dd_metastate_Llm_Token_decoder_{tier}.plan").read_text())
    sched = prepared["token"][0]
    k = sched.names.index(plan["io"]["attention_mask"])
    plan["arena"]["sizes"][k] -= 8
    plan["kv_cache"]["shape"][2] = tier * 2
    found = [m for _, m in plans.plan_problems(plan, sched, phase="token", tier=tier)]
    assert any(f"smaller than the {8 * tier} bytes it needs" in m for m in found)  # attention_mask: int64 [1, T]
    assert any(f"KV bindings are [1, 2, {tier * 2}, 64]" in m for m in found)


def test_schedule_shapes_are_derived_not_guessed():
    """A dimension that is neither constant nor S nor T cannot be shared: the fuse stage refuses it."""
    from raipack.npu import plans

    io = {"input_ids": "ids", "attention_mask": "mask", "logits": "logits", "past": [], "present": []}
    steps = [{"node": "n", "op_type": "Op", "device": "cpu", "inputs": ["ids", "mask"], "outputs": ["logits"], "scratch": 0}]

    def probes(dims):
        (a, b) = plans.PROBES["prefill"]
        return [(p, steps, {"ids": ("int64", [1, p[0]]), "mask": ("int64", [1, p[1]]), "logits": ("float32", dims(*p))}) for p in (a, b)]

    doc = plans.derive_schedule(phase="prefill", node="decoder", probes=probes(lambda S, T: [1, S, 7, T]), io=io, weights=set())
    assert doc["tensors"]["logits"]["shape"] == [1, "S", 7, "T"] and doc["tensors"]["ids"]["shape"] == [1, "S"]
    with pytest.raises(formats.FormatError, match="logits is float32 .* neither constant nor S nor T"):
        plans.derive_schedule(phase="prefill", node="decoder", probes=probes(lambda S, T: [1, S + T]), io=io, weights=set())


@pytest.mark.parametrize("pid", ["reference-4K", "reference-16K"])
def test_validate_is_clean_with_hashes(packages, pid):
    pkg, _ = packages[pid]
    result = _validate(pkg, verify_hashes=True)
    assert result.profile == pid
    assert result.findings == []
    assert {"RP901", "RP902", "RP903", "RP904", "RP905", "RP906", "RP907"} <= set(result.checks_run)


def test_npu_checks_are_noops_on_other_packages(make_pkg):
    for pid in ("1.8.0-npu-16K", "1.7.1-npu-4K", "reference-4K"):  # factory packages: headers are not raipack's
        result = _validate(make_pkg(pid), verify_hashes=True)
        assert not [f for f in result.findings if f.check_id.startswith("RP9")], pid


def test_fuse_writes_only_into_a_new_or_empty_folder(packages, oga16k, tmp_path):
    """fuse() writes into its folder and nothing beside it; staging and swapping are the runner's."""
    from raipack.core.errors import RaipackError
    from raipack.npu.profile import get as get_profile
    from raipack.stages.fuse.reference import fuse

    out = tmp_path / "pkg"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    with pytest.raises(RaipackError, match="pkg is not an empty folder"):
        fuse(oga16k, out, get_profile("reference-4K"), quark_dir=oga16k.parent / "quark")
    assert [p.name for p in out.iterdir()] == ["stale.txt"]  # nothing of the user's replaced
    (out / "stale.txt").unlink()
    fuse(oga16k, out, get_profile("reference-4K"), quark_dir=oga16k.parent / "quark")
    assert (out / "model.bin").is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]
    bad = changed(get_profile("reference-4K"), {"genai": {"search": {"chunk_size": 300}}})
    with pytest.raises(RaipackError, match="chunk_size 300, which is not one of its prefill tiers"):
        fuse(oga16k, tmp_path / "never", bad, quark_dir=oga16k.parent / "quark")
    assert not (tmp_path / "never").exists() and not list(tmp_path.glob(".never*"))


def test_unsupported_group_size_is_reported_not_hidden(oga16k, tmp_path, prompt_ids, reference):
    from raipack.npu.profile import get as get_profile
    from raipack.runtime.reference import ReferenceRuntime
    from raipack.stages.fuse.reference import fuse

    profile = changed(get_profile("reference-4K"), {"quantization": {"allowed_group_sizes": [32, 64]}})  # the export has block_size 128
    report = fuse(oga16k, tmp_path / "pkg", profile, quark_dir=oga16k.parent / "quark")
    assert not report["npu_complete"]
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert errors and all("block_size (group size) is 128" in f["message"] for f in errors if f["check_id"] == "fuse-npu-constraint")
    assert report["fused_counts"] == {"GQARope": 2}  # attention has no matmul; every projection stays on the CPU
    assert sum(1 for n in report["cpu_nodes"] if n["why"] == "not fused") >= 10
    header = formats.read_header(tmp_path / "pkg" / "model.pb.bin")
    assert [n for n in header["cpu_nodes"] if n["why"] == "not fused"]
    _assert_parity(ReferenceRuntime(tmp_path / "pkg", threads=2), reference, prompt_ids(40))  # still runs, still right


def test_context_too_short_for_every_token_tier_is_refused(oga_default, tmp_path):
    from raipack.core.errors import RaipackError
    from raipack.npu.profile import get as get_profile
    from raipack.stages.fuse.reference import fuse

    folder, _ = oga_default
    short = tmp_path / "short"
    shutil.copytree(folder, short)
    genai = json.loads((short / "genai_config.json").read_text())
    genai["model"]["context_length"] = 256  # below the smallest token tier (384)
    (short / "genai_config.json").write_text(json.dumps(genai))
    with pytest.raises(RaipackError, match="context of 256 positions is below every token tier"):
        fuse(short, tmp_path / "pkg", get_profile("reference-4K"))
    assert not (tmp_path / "pkg").exists()


def test_quantized_lm_head_becomes_a_fused_qmatmul(oga16k, tmp_path, reference, prompt_ids):
    """The builder's own int4 lm_head (shared with a GatherBlockQuantized embedding) is fused as
    QMatMul; its weights, also read by the CPU-side embedding, stay in model.onnx.data."""
    from raipack.npu.profile import get as get_profile
    from raipack.runtime.ortloop import OrtDecoder
    from raipack.runtime.reference import ReferenceRuntime
    from raipack.stages.export.builder import export
    from raipack.stages.fuse.reference import fuse

    oga = tmp_path / "oga"
    export(oga16k.parent / "quark", oga, keep_excluded_float=False)
    report = fuse(oga, tmp_path / "pkg", get_profile("reference-4K"), quark_dir=oga16k.parent / "quark")
    assert report["fused_counts"].get("QMatMul") == 1 and report["findings"] == []
    header = formats.read_header(tmp_path / "pkg" / "model.pb.bin")
    head = next(op for op in header["operators"] if op["op_type"] == "QMatMul")
    assert head["tensors"] == [] and "lm_head.MatMul.weight_Q4" in head["cpu_inputs"]
    prompt = prompt_ids(50)
    want, rows = OrtDecoder(oga, threads=2).greedy(prompt, 32)
    got, got_rows = ReferenceRuntime(tmp_path / "pkg", threads=2).generate(prompt, 32, return_logits=True)
    assert got == want and max(np.abs(a - b).max() for a, b in zip(rows, got_rows)) <= TOL


# ------------------------------------------------------------------------------------ parity


@pytest.mark.parametrize("pid", ["reference-4K", "reference-16K"])
@pytest.mark.parametrize("n", [100, 200, 400, 900, 1800, 4000])
def test_parity_in_every_prefill_tier(runtimes, reference, prompt_ids, n, pid):
    rt = runtimes[pid]
    calls = _assert_parity(rt, reference, prompt_ids(n))
    tier = min(t for t in rt.prefill_tiers if t >= n)
    assert calls[0] == ("prefill", tier, _window(rt, tier))
    assert calls[1:] == [("token", _window(rt, end), _window(rt, end)) for end in range(n + 1, n + STEPS)]


def _window(rt, end: int) -> int:
    """The KV window a call ending at position `end` must use: the smallest token tier holding it."""
    return min(t for t in rt.token_tiers if t >= end)


def test_parity_across_token_tier_boundary_16k(runtimes, reference, prompt_ids):
    rt = runtimes["reference-16K"]
    first = _window(rt, 4091)
    second = _window(rt, first + 1)
    calls = _assert_parity(rt, reference, prompt_ids(4090), steps=first - 4090 + 8)
    assert calls[0] == ("prefill", 4096, _window(rt, 4096))
    windows = [w for phase, _, w in calls if phase == "token"]
    assert windows[0] == first and windows[-1] == second > first  # past the first window → the next tier, KV re-laid out


def test_parity_short_prompt_16k(runtimes, reference, prompt_ids):
    rt = runtimes["reference-16K"]
    calls = _assert_parity(rt, reference, prompt_ids(7))
    assert calls[0] == ("prefill", 128, _window(rt, 128))


def test_chunked_prefill_matches(oga16k, tmp_path, reference, prompt_ids):
    """A profile whose max_prompt_length exceeds its largest prefill tier: prompts run in chunks of
    chunk_size, the last one padded to its tier, the KV window growing between chunks."""
    from raipack.npu.profile import get as get_profile
    from raipack.runtime.reference import ReferenceRuntime
    from raipack.stages.fuse.reference import fuse

    doc = get_profile("reference-16K").document()
    doc["buckets"] = {"prefill": [128, 256], "token": [512, 1024, 2048]}
    doc["genai"]["search"].update(max_length=2048, chunk_size=256)
    doc["max_prompt_length"] = {"1.8.0": 1000}
    profile = build(doc, "a test's variation of reference-16K")
    report = fuse(oga16k, tmp_path / "pkg", profile, quark_dir=oga16k.parent / "quark")
    assert report["lengths"]["chunked"] and report["lengths"]["max_prompt_length"] == {"1.8.0": 1000}
    rt = ReferenceRuntime(tmp_path / "pkg", threads=2)
    calls = _assert_parity(rt, reference, prompt_ids(700))
    assert calls[:3] == [("prefill", 256, 512), ("prefill", 256, 512), ("prefill", 256, 1024)]
    calls = _assert_parity(rt, reference, prompt_ids(300))
    assert calls[:2] == [("prefill", 256, 512), ("prefill", 128, 512)]


def test_prefill_logits_match_reference(runtimes, reference, prompt_ids):
    prompt = prompt_ids(33)
    _, rows = reference(prompt)
    got = runtimes["reference-4K"].prefill(prompt)
    assert got.shape == (512,) and np.abs(got - rows[0]).max() <= TOL


# ------------------------------------------------------------------------------------ refusals


def test_refusals_are_one_sentence(runtimes, prompt_ids, packages):
    from raipack.runtime.reference import ReferenceRuntime, RuntimeRefusal

    rt4, rt16 = runtimes["reference-4K"], runtimes["reference-16K"]
    with pytest.raises(RuntimeRefusal, match=r"prompt of 4097 tokens exceeds the package's maximum prompt length of 4096") as info:
        rt16.generate(prompt_ids(4097), 1)
    assert "\n" not in str(info.value) and str(info.value).count(". ") == 0
    with pytest.raises(RuntimeRefusal, match=r"4000 prompt tokens plus 200 new tokens exceed the package's maximum length of 4096"):
        rt4.generate(prompt_ids(4000), 200)
    with pytest.raises(RuntimeRefusal, match="empty"):
        rt4.prefill([])
    old = ReferenceRuntime(packages["reference-4K"][0], threads=1, verify="sizes", sdk_version="1.5.1")
    assert old.max_prompt_length == 2048
    with pytest.raises(RuntimeRefusal, match="maximum prompt length of 2048 tokens"):
        old.prefill(prompt_ids(2049))


# ------------------------------------------------------------------------------------ corruption


def test_flipped_byte_in_model_bin_is_caught(packages, tmp_path):
    from raipack.runtime.reference import PackageError, ReferenceRuntime

    pkg = _copy(packages["reference-4K"][0], tmp_path)
    header = formats.read_header(pkg / "model.pb.bin")
    t = next(t for _, _, _, t in formats.header_tensors(header) if t["role"] == "gate.B")
    with open(pkg / "model.bin", "r+b") as fh:
        fh.seek(t["offset"] + 100)
        b = fh.read(1)
        fh.seek(t["offset"] + 100)
        fh.write(bytes([b[0] ^ 0x10]))
    with pytest.raises(PackageError, match="do not match the sha256") as info:
        ReferenceRuntime(pkg)
    assert t["name"] in str(info.value)
    assert "RP902" not in _ids(_validate(pkg))  # hashes only with --verify-hashes
    findings = [f for f in _validate(pkg, verify_hashes=True).findings if f.check_id == "RP902"]
    assert len(findings) == 1 and findings[0].pointer == t["name"]


def test_swapped_weights_file_is_caught(packages, tmp_path):
    from raipack.runtime.reference import PackageError, ReferenceRuntime

    pkg = _copy(packages["reference-4K"][0], tmp_path)
    shutil.copyfile(packages["reference-16K"][0] / "model.bin", pkg / "model.bin")  # longer rotary tables
    with pytest.raises(PackageError, match="disagree"):
        ReferenceRuntime(pkg)
    assert "RP901" in _ids(_validate(pkg))


def test_missing_tier_is_caught(packages, tmp_path):
    from raipack.npu.profile import get as get_profile
    from raipack.runtime.reference import PackageError, ReferenceRuntime

    pkg = _copy(packages["reference-16K"][0], tmp_path)
    tier = 8064  # a token tier of the 1.8.0 16K profile
    assert tier in get_profile("reference-16K").buckets.token
    for p in pkg.glob(f"dd_metastate_Llm_Token_decoder_{tier}.*"):
        p.unlink()
    result = _validate(pkg)
    assert any(f.check_id == "RP602" and str(tier) in f.path for f in result.findings)
    with pytest.raises(PackageError, match=f"token tier {tier} has no plan"):
        ReferenceRuntime(pkg, verify="sizes")


def test_edited_header_is_caught(packages, tmp_path):
    from raipack.runtime.reference import PackageError, ReferenceRuntime

    src = packages["reference-4K"][0]
    # 1. an edit that does not update the header's own sha256
    pkg = _copy(src, tmp_path / "a")
    raw = bytearray((pkg / "model.pb.bin").read_bytes())
    i = raw.index(b'"weights_size"')
    raw[i + 20] = ord("9") if raw[i + 20] != ord("9") else ord("8")
    (pkg / "model.pb.bin").write_bytes(bytes(raw))
    assert any(f.check_id == "RP901" and "sha256" in f.message for f in _validate(pkg).findings)
    with pytest.raises(PackageError, match="header was edited"):
        ReferenceRuntime(pkg)
    # 2. a consistent re-encoding that moves one tensor
    pkg = _copy(src, tmp_path / "b")
    doc = formats.read_header(pkg / "model.pb.bin")
    doc["operators"][0]["tensors"][1]["offset"] += 4096
    (pkg / "model.pb.bin").write_bytes(formats.encode_header(doc))
    ids = _ids(_validate(pkg, verify_hashes=True))
    assert {"RP901", "RP903", "RP904", "RP905"} <= ids
    with pytest.raises(PackageError):
        ReferenceRuntime(pkg)


def test_edited_plan_is_caught(packages, tmp_path):
    from raipack.runtime.reference import PackageError, ReferenceRuntime

    pkg = _copy(packages["reference-4K"][0], tmp_path)
    path = pkg / "dd_metastate_Llm_Prefill_decoder_256.plan"
    plan = json.loads(path.read_text())
    plan["kv_window"] = 2048
    path.write_text(json.dumps(plan))
    findings = [f for f in _validate(pkg).findings if f.check_id == "RP905"]
    assert any("sha256" in f.message for f in findings) and any("window" in f.message for f in findings)
    with pytest.raises(PackageError, match="Prefill_decoder_256.plan"):
        ReferenceRuntime(pkg, verify="sizes")


def test_edited_schedule_is_caught(packages, tmp_path):
    """The .state chain covers the shared schedule: each plan records its sha256."""
    from raipack.npu import plans
    from raipack.runtime.reference import PackageError, ReferenceRuntime

    pkg = _copy(packages["reference-4K"][0], tmp_path)
    path = pkg / plans.schedule_rel("decoder", "token")
    doc = json.loads(path.read_text())
    doc["buffers"][0]["last_step"] += 1
    path.write_text(json.dumps(doc))
    findings = [f for f in _validate(pkg).findings if f.check_id == "RP905"]
    assert findings and all("Token" in f.path and "another sha256 for cache/decoder_token.schedule.json" in f.message for f in findings)
    with pytest.raises(PackageError, match="does not name cache/decoder_token.schedule.json with its sha256"):
        ReferenceRuntime(pkg, verify="sizes")
    path.unlink()
    assert any(f.check_id == "RP905" and f.path == plans.schedule_rel("decoder", "token") and "is missing" in f.message for f in _validate(pkg).findings)


def test_version_1_plan_is_refused_with_one_sentence(packages, tmp_path):
    """A package built by an older raipack (plans of format version 1) is refused by validate and by
    the runtime with one sentence that says to rebuild."""
    from raipack.runtime.reference import PackageError, ReferenceRuntime

    pkg = _copy(packages["reference-4K"][0], tmp_path)
    for path in pkg.glob("dd_metastate_*.plan"):
        plan = json.loads(path.read_text())
        plan["format_version"] = 1
        raw = (json.dumps(plan) + "\n").encode()
        path.write_bytes(raw)
        state_path = path.with_suffix(".state")
        state = formats.decode_state(state_path.read_bytes())
        state_path.write_bytes(formats.encode_state({**state, "plan_sha256": formats.sha256_hex(raw)}))
    for path in (pkg / "cache").glob("*.schedule.json"):  # an older raipack wrote none
        path.unlink()
    found = [f for f in _validate(pkg).findings if f.check_id == "RP905"]
    assert len(found) == 1 and found[0].severity == "error"
    n = len(list(pkg.glob("dd_metastate_*.plan")))
    assert f"is a version 1 plan (as are {n - 1} more plans), written by an older raipack" in found[0].message and "raipack build" in found[0].hint
    with pytest.raises(PackageError, match="version 1 plan, written by an older raipack") as info:
        ReferenceRuntime(pkg, verify="sizes")
    assert "raipack build" in info.value.hint and "\n" not in str(info.value)


# ------------------------------------------------------------------------------------ formats


def test_header_roundtrip_and_problems():
    doc = {"format": formats.HEADER_FORMAT, "format_version": 1, "weights_file": "model.bin", "weights_size": 8192, "alignment": 4096,
           "operators": [{"name": "A", "tensors": [
               {"role": "x.B", "name": "w", "offset": 0, "size": 16, "dtype": "uint8", "shape": [4, 4], "sha256": "0" * 64},
               {"role": "x.scales", "name": "s", "offset": 4096, "size": 8, "dtype": "float32", "shape": [2], "sha256": "1" * 64}]}]}
    data = formats.encode_header(doc)
    assert data[:8] == formats.MAGIC and formats.decode_header(data) == doc
    assert formats.header_problems(doc, 8192) == []
    doc["operators"][0]["tensors"][1].update(offset=100, size=12)
    messages = [m for _, m in formats.header_problems(doc, 4096)]
    assert any("not a multiple of the 4096-byte alignment" in m for m in messages)
    assert any("needs 8" in m for m in messages)
    assert any("weights_size 8192" in m for m in messages)
    with pytest.raises(formats.FormatError, match="magic"):
        formats.decode_header(b"\x08\x01" + data[2:])
    with pytest.raises(formats.FormatError, match="truncated"):
        formats.decode_header(data[:-5])


def test_assign_offsets_never_overlaps_live_buffers():
    rng = np.random.default_rng(0)
    bufs = []
    for k in range(200):
        a = int(rng.integers(0, 50))
        bufs.append({"name": f"t{k}", "size": int(rng.integers(1, 5000)), "first_step": a, "last_step": a + int(rng.integers(0, 10))})
    from raipack.npu import arena

    size = arena.assign_offsets(bufs)
    for x in bufs:
        assert x["offset"] % formats.PLAN_ALIGNMENT == 0 and x["offset"] + x["size"] <= size
        for y in bufs:
            if x is not y and x["first_step"] <= y["last_step"] and y["first_step"] <= x["last_step"]:
                assert x["offset"] + x["size"] <= y["offset"] or y["offset"] + y["size"] <= x["offset"]


def test_overlap_check_finds_every_live_overlap_without_numpy(packages):
    """Schedule.overlaps (run for every tier by RP905 and the runtime) against a plain double loop over
    every pair of buffers, on the real prefill schedule with random offsets and sizes (zeros included),
    and the validate path never imports numpy for it."""
    import subprocess
    import sys

    from raipack.npu import plans

    pkg, _ = packages["reference-16K"]
    doc, _ = _schedule(pkg, "prefill")
    sched = plans.Schedule(doc)
    first, last = sched.first, [b["last_step"] for b in doc["buffers"]]
    n, rng, found = len(first), np.random.default_rng(1), 0
    for _ in range(20):
        offsets = [int(x) for x in rng.integers(0, 40, n) * 64]
        sizes = [int(x) for x in rng.integers(0, 3, n) * 64]
        want = {(i, j) for i in range(n) for j in range(n) if i != j and first[i] <= last[j] and first[j] <= last[i]
                and sizes[i] and sizes[j] and offsets[i] < offsets[j] + sizes[j] and offsets[j] < offsets[i] + sizes[i]}
        got = sched.overlaps(offsets, sizes)
        assert {frozenset(p) for p in got} == {frozenset(p) for p in want} and len(got) == len(want) // 2
        found += len(got)
    assert found  # the random arenas did overlap
    code = ("import json, sys; from raipack.npu import plans\n"
            "s = plans.Schedule(json.load(open(sys.argv[1])))\n"
            "print(s.overlaps([0] * len(s.names), [64] * len(s.names)) != [], 'numpy' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code, str(pkg / plans.schedule_rel("decoder", "prefill"))], capture_output=True, text=True)
    assert proc.stdout.split() == ["True", "False"], proc.stdout + proc.stderr


def test_a_validation_reads_the_header_and_small_metastate_files_once(monkeypatch):
    """RP901-RP905 share one read of model.pb.bin (and its sha256), and a .state or .const file the
    package scan read whole is not opened again: every open of a package file is counted, whichever
    way it is opened (os.open, open, Path.read_bytes)."""
    import builtins
    import collections
    import io
    import os

    from factory import reference_package
    from raipack.validate import validate

    pkg = reference_package("reference-16K").resolve()
    opened: collections.Counter = collections.Counter()

    def counting(real):
        def wrapper(path, *args, **kwargs):
            if isinstance(path, (str, os.PathLike)) and os.path.realpath(path).startswith(f"{pkg}/"):
                opened[os.path.relpath(os.path.realpath(path), pkg)] += 1
            return real(path, *args, **kwargs)
        return wrapper

    for module, name in ((os, "open"), (io, "open"), (builtins, "open")):
        monkeypatch.setattr(module, name, counting(getattr(module, name)))
    report = validate(pkg)
    monkeypatch.undo()
    assert not [f for f in report.findings if f.severity == "error"]
    small = [p.relative_to(pkg).as_posix() for p in (*pkg.glob("*.state"), *(pkg / "cache").glob("*.const")) if p.stat().st_size <= 1024]
    assert len(small) > 40 and {opened[rel] for rel in small} == {1}, {rel: opened[rel] for rel in small if opened[rel] != 1}
    assert opened["model.pb.bin"] == 1


def test_target_without_reference_profile_is_refused_before_any_stage_runs(tiny_llama, tmp_path, monkeypatch, capsys):
    """The reference backend builds only targets with a reference profile (1.7.1/1.8.0 NPU and hybrid);
    an older hybrid target is refused up front, not after minutes of quantizing."""
    from raipack.cli import main

    monkeypatch.setenv("RAIPACK_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SystemExit) as info:
        main(["build", str(tiny_llama), "--profile", "1.6-hybrid", "--output", str(tmp_path / "out"), "--backend", "reference"])
    out, err = capsys.readouterr()
    assert info.value.code == 2 and "Traceback" not in out + err  # a usage error: this target cannot be built
    assert "profile 1.6-hybrid has no reference profile" in err and "1.8.0-npu-16K" in err and "1.8.0-hybrid" in err
    assert "quantize" not in out + err.split("ERROR")[0]
    assert not any((tmp_path / "cache").rglob("manifest.json"))
