"""Every check fails on a package broken its way and passes on a clean one."""

from __future__ import annotations

import os
import shutil

import pytest

from factory import Dims, lfs_pointer_text, make_graph, reference_export, save_graph, write_manifest
from helpers import edit_json, ryzen
from raipack.checks import load_all
from raipack.cli import main
from raipack.modelpackage import layout
from raipack.npu import formats
from raipack.npu.profile import all_profiles, changed
from raipack.npu.profile import get as get_profile
from raipack.validate import validate

P16, P4, P16_OLD = "1.8.0-npu-16K", "1.8.0-npu-4K", "1.6-npu"
GENAI = "genai_config.json"


@pytest.mark.parametrize("profile_id", sorted(all_profiles()))
def test_generated_package_is_clean_and_detected(make_pkg, profile_id):
    pkg = make_pkg(profile_id)
    result = validate(pkg)
    assert result.profile == profile_id, result.profile_reason
    assert [f for f in result.findings if f.severity in ("error", "warning")] == []
    package_checks = set(layout.spec()["checks"]) if all_profiles()[profile_id].target == "model-package" else set()  # its own MP ids besides its variants'
    assert set(result.checks_run) == {c for c, s in load_all().items() if not s.needs} | package_checks


def _rm(rel):
    def mutate(pkg):
        target = pkg / rel
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    return mutate


def _write(rel, data: bytes):
    def mutate(pkg):
        (pkg / rel).write_bytes(data)
    return mutate


def _json(rel, fn):
    return lambda pkg: edit_json(pkg / rel, fn)


def _opt(key, value):
    def fn(doc):
        if value is None:
            ryzen(doc).pop(key)
        else:
            ryzen(doc)[key] = value
    return _json(GENAI, fn)


def _weight(key, value):
    return _json("config.json", lambda d: d["quantization_config"]["global_quant_config"]["weight"].__setitem__(key, value))


def _graph(**kw):
    def mutate(pkg):
        (pkg / "model.onnx.data").unlink()
        save_graph(make_graph(Dims(), **kw), pkg, "model.onnx", "model.onnx.data")
    return mutate


def _symlink(target, name="evil.txt"):
    return lambda pkg: os.symlink(target, pkg / name)


def _loop(pkg):
    os.symlink(pkg / "b", pkg / "a")
    os.symlink(pkg / "a", pkg / "b")


def _truncate(rel, size):
    def mutate(pkg):
        with open(pkg / rel, "r+b") as fh:
            fh.truncate(size)
    return mutate


def _flip_byte(rel):
    def mutate(pkg):
        with open(pkg / rel, "r+b") as fh:
            first = fh.read(1)
            fh.seek(0)
            fh.write(bytes([first[0] ^ 0xFF]))
    return mutate


def _header_bytes(offset: int, data: bytes):
    """Overwrite model.pb.bin's preamble at `offset` (8 magic, 12 version, 16 JSON length)."""
    def mutate(pkg):
        with open(pkg / "model.pb.bin", "r+b") as fh:
            fh.seek(offset)
            fh.write(data)
    return mutate


PICKLE = b"\x80\x04\x95" + b"\x00" * 40
CASES = [
    # id, profile, mutation, check expected, severity, path fragment
    ("symlink-outside", P16, _symlink("/etc/hostname"), "RP101", "error", "evil.txt"),
    ("symlink-loop", P16, _loop, "RP101", "error", "a"),
    ("fifo", P16, lambda p: os.mkfifo(p / "pipe"), "RP101", "error", "pipe"),
    ("lfs-pointer", P16, _write("model.bin", lfs_pointer_text(4096).encode()), "RP102", "error", "model.bin"),
    ("empty-weights", P16, _write("model.bin", b""), "RP103", "error", "model.bin"),
    ("path-escape", P16, _json(GENAI, lambda d: d["model"]["decoder"].__setitem__("filename", "../model.onnx")), "RP104", "error", GENAI),
    ("pickle", P16, _write("pytorch_model.bin", PICKLE), "RP105", "warning", "pytorch_model.bin"),
    ("pickle-named-bin", P16, _write("weights.bin", PICKLE), "RP105", "warning", "weights.bin"),
    ("code", P16, _write("modeling_evil.py", b"open('/tmp/pwned','w')\n"), "RP106", "warning", "modeling_evil.py"),
    ("shared-library", P16, _write("libevil.so", b"\x7fELF" + bytes(60)), "RP113", "error", "libevil.so"),  # tests/test_pipeline/test_shared_library.py
    ("missing-header", P16, _rm("model.pb.bin"), "RP404", "error", GENAI),  # named by external_data_file: RP404, not the profile's list (RP107)
    ("missing-vision-graph", P16, _json(GENAI, lambda d: d["model"].__setitem__("vision", {"filename": "vision.onnx"})), "RP109", "error", "vision.onnx"),
    ("missing-tokenizer", P16, _rm("tokenizer.json"), "RP107", "error", "tokenizer.json"),
    ("truncated-json", P16, _truncate(GENAI, 100), "RP201", "error", GENAI),
    ("non-utf8-json", P16, _write("config.json", b'{"a": "\xff\xfe"}'), "RP201", "error", "config.json"),
    ("nan-json", P16, _write("rai_config.json", b'{"max_prompt_length": {"1.8.0": NaN}}'), "RP201", "error", "rai_config.json"),
    ("json-is-folder", P16, lambda p: ((p / "rai_config.json").unlink(), (p / "rai_config.json").mkdir()), "RP201", "error", "rai_config.json"),
    ("duplicate-key", P16, _write("rai_config.json", b'{"max_prompt_length": {"1.8.0": 4096}, "max_prompt_length": {"1.8.0": 2048}}'), "RP203", "error", "rai_config.json"),
    ("loader-misspelled-key", P16, _json(GENAI, lambda d: d["search"].__setitem__("tpo_p", d["search"].pop("top_p", 1.0))), "RP204", "error", GENAI),
    ("schema-type", P16, _json(GENAI, lambda d: d["search"].__setitem__("max_length", "16384")), "RP202", "error", GENAI),
    ("group-64", P16, _weight("group_size", 64), "RP301", "error", "config.json"),
    ("symmetric", P16, _weight("symmetric", True), "RP301", "error", "config.json"),
    ("dtype-int8", P16, _weight("dtype", "int8"), "RP301", "error", "config.json"),
    ("per-channel", P16, _weight("qscheme", "per_channel"), "RP301", "error", "config.json"),
    ("pack-order", P16, _json("config.json", lambda d: d["quantization_config"]["export"].__setitem__("pack_method", "order")), "RP301", "error", "config.json"),
    ("kv-quant", P16, _json("config.json", lambda d: d["quantization_config"].__setitem__("kv_cache_quant_config", {"dtype": "fp8"})), "RP301", "error", "config.json"),
    ("activations", P16, _json("config.json", lambda d: d["quantization_config"]["global_quant_config"].__setitem__("input_tensors", {"dtype": "int8"})), "RP301", "error", "config.json"),
    ("not-quark", P16, _json("config.json", lambda d: d["quantization_config"].__setitem__("quant_method", "awq")), "RP301", "error", "config.json"),
    ("lm-head-quantized", P16, _json("config.json", lambda d: d["quantization_config"].__setitem__("exclude", [])), "RP301", "warning", "config.json"),
    ("option-int", P16, _opt("hybrid_opt_max_seq_length", 4096), "RP401", "error", GENAI),
    ("not-power-of-two", P16, _opt("hybrid_opt_max_seq_length", "3000"), "RP402", "error", GENAI),
    ("backend-cpu", P16, _opt("hybrid_opt_token_backend", "cpu"), "RP403", "error", GENAI),
    ("header-not-there", P16, _opt("external_data_file", "other.pb.bin"), "RP404", "error", GENAI),
    ("weights-sibling-missing", P16, _rm("model.bin"), "RP404", "error", "model.bin"),
    ("no-cache-folder", P16, _rm("cache"), "RP405", "error", "cache"),
    ("required-option-missing", P16, _opt("hybrid_opt_token_backend", None), "RP406", "warning", GENAI),
    ("load-bearing-option-missing", P16, _opt("external_data_file", None), "RP406", "error", GENAI),
    ("option-other-value", P16, _opt("hybrid_opt_chunk_context", "0"), "RP406", "warning", GENAI),
    ("option-typo", P16, _opt("hybrid_opt_max_seq_lenght", "4096"), "RP406", "warning", GENAI),
    ("no-ryzenai-block", P16, _json(GENAI, lambda d: d["model"]["decoder"]["session_options"].__setitem__("provider_options", [])), "RP406", "error", GENAI),
    ("max-above-context", P16, _json(GENAI, lambda d: d["model"].__setitem__("context_length", 8192)), "RP501", "warning", GENAI),
    ("chunk-above-max", P4, _json(GENAI, lambda d: d["search"].__setitem__("chunk_size", 8192)), "RP501", "warning", GENAI),
    ("kv-buffer-small", P16_OLD, _json(GENAI, lambda d: d["model"]["decoder"]["session_options"]["config_entries"].__setitem__("max_length_for_kv_cache", "2048")), "RP501", "warning", GENAI),
    ("prompt-above-max", P4, _json("rai_config.json", lambda d: d["max_prompt_length"].__setitem__("1.8.0", 8192)), "RP501", "warning", "rai_config.json"),
    ("prompt-above-npu", P4, lambda p: (_opt("hybrid_opt_chunk_context", "0")(p), _opt("hybrid_opt_max_seq_length", "2048")(p)), "RP501", "warning", "rai_config.json"),
    ("hybrid-past-one-pass", "1.7.1-hybrid", _json(GENAI, lambda d: d["search"].__setitem__("max_length", 8192)), "RP501", "warning", GENAI),
    ("prompt-above-sdk", P16, _json("rai_config.json", lambda d: d["max_prompt_length"].__setitem__("1.5.0", 4096)), "RP501", "warning", "rai_config.json"),
    ("layers-disagree", P16, _json("config.json", lambda d: d.__setitem__("num_hidden_layers", 3)), "RP502", "error", GENAI),
    ("tokenizer-too-big", P16, _json("config.json", lambda d: d.__setitem__("vocab_size", 100)) , "RP502", "error", ""),
    ("eos-outside-vocab", P16, _json(GENAI, lambda d: d["model"].__setitem__("eos_token_id", [2, 99999])), "RP503", "error", GENAI),
    ("pad-outside-vocab", P16, _json("generation_config.json", lambda d: d.__setitem__("pad_token_id", -1)), "RP503", "error", "generation_config.json"),
    ("window-the-model-lacks", P16, _json(GENAI, lambda d: d["model"]["decoder"].__setitem__("sliding_window", {"window_size": 64, "layers": [0, 1]})), "RP504", "error", GENAI),
    ("longrope-factors-of-a-full-rotary", P16, _json("config.json", lambda d: d.update(partial_rotary_factor=0.75, rope_scaling={"type": "longrope", "long_factor": [1.0] * 16, "short_factor": [1.0] * 12})), "RP505", "error", "config.json"),
    ("metastate-orphan", P16_OLD, _rm("dd_metastate_Llm_Token_MatMulNBits_0_0.state"), "RP601", "error", "dd_metastate_Llm_Token_MatMulNBits_0_0"),
    ("metastate-sibling", P16_OLD, _rm("dd_metastate_Llm_Token_MatMulNBits_1_0.fconst"), "RP601", "error", "dd_metastate_Llm_Token_MatMulNBits_1_0.fconst"),
    ("no-metastate", P16, lambda p: [f.unlink() for f in p.glob("dd_metastate_*")], "RP601", "error", "dd_metastate_"),
    ("tier-missing", "reference-16K", lambda p: (_rm("dd_metastate_Llm_Prefill_decoder_512.state")(p), _rm("dd_metastate_Llm_Prefill_decoder_512.plan")(p), write_manifest(p)), "RP602", "error", "512"),
    ("tier-extra", "reference-16K", lambda p: (_write("dd_metastate_Llm_Token_decoder_5000.state", b"{}")(p), _write("dd_metastate_Llm_Token_decoder_5000.plan", b"{}")(p), write_manifest(p)), "RP602", "warning", "5000"),
    ("tier-too-small", "reference-16K", lambda p: (_json(GENAI, lambda d: d["search"].__setitem__("max_length", 20000))(p), _json(GENAI, lambda d: d["model"].__setitem__("context_length", 32768))(p), write_manifest(p)), "RP602", "error", "16384"),
    ("const-missing", P16, _rm("cache/MatMulNBits_0_0_wts.const"), "RP603", "error", "cache/MatMulNBits_0_0_meta.json"),
    ("txn-bins-missing", P16, _rm("cache/txn_bins.zip"), "RP111", "error", "cache/txn_bins.zip"),  # issue 24
    ("node-meta-missing", P16, _rm("cache/MatMulNBits_0_0_meta.json"), "RP111", "error", "cache/MatMulNBits_0_0_meta.json"),
    ("amd-weights-short", P16, _truncate("model.bin", 2048), "RP112", "error", "model.bin"),
    ("const-size", P16, _write("cache/MatMulNBits_1_0_wts.const", b"short"), "RP603", "error", "cache/MatMulNBits_1_0_wts.const"),
    ("hub-large-file-outside-lfs", P16, lambda p: (_write("notes.dat", b"")(p), _truncate("notes.dat", 11 * 2**20)(p)), "RP110", "warning", "notes.dat"),
    ("graph-garbage", P16, _write("model.onnx", b"\x08\x07garbage" * 10), "RP701", "error", "model.onnx"),
    ("data-truncated", P16, _truncate("model.onnx.data", 100), "RP702", "error", "model.onnx"),
    ("data-missing", P16, _rm("model.onnx.data"), "RP702", "error", "model.onnx"),
    ("kv-heads", P16, _json(GENAI, lambda d: d["model"]["decoder"].__setitem__("num_key_value_heads", 4)), "RP703", "error", "model.onnx"),
    ("input-renamed", P16, _json(GENAI, lambda d: d["model"]["decoder"]["inputs"].__setitem__("input_ids", "ids")), "RP703", "error", "model.onnx"),
    ("head-size", P16, _json(GENAI, lambda d: d["model"]["decoder"].__setitem__("head_size", 64)), "RP703", "error", "model.onnx"),
    ("block-32", P16, _graph(block_size=32), "RP704", "error", "model.onnx"),
    ("lm-head-requantized", P16, _graph(quantize_lm_head=True), "RP704", "error", "model.onnx"),
    ("header-magic", "reference-16K", _flip_byte("model.pb.bin"), "RP901", "error", "model.pb.bin"),
    ("header-truncated", "reference-4K", _truncate("model.pb.bin", 4000), "RP901", "error", "model.pb.bin"),
    ("header-version", "reference-4K", _header_bytes(8, (2).to_bytes(4, "little")), "RP901", "error", "model.pb.bin"),
    ("header-json-length", "reference-1.7.1-16K", _header_bytes(16, (1 << 40).to_bytes(8, "little")), "RP901", "error", "model.pb.bin"),
    ("header-not-raipack", "reference-1.7.1-4K", _write("model.pb.bin", b"\x08\x01\x12\x04AMD!" * 100), "RP901", "error", "model.pb.bin"),
    ("max-length-not-top-tier", "reference-16K", lambda p: (_json(GENAI, lambda d: d["search"].__setitem__("max_length", 8192))(p), write_manifest(p)), "RP906", "error", GENAI),
    ("npu-seq-not-top-prefill", "reference-4K", lambda p: (_opt("hybrid_opt_max_seq_length", "2048")(p), write_manifest(p)), "RP906", "error", GENAI),
    ("chunk-not-a-tier", "reference-4K", lambda p: (_json(GENAI, lambda d: d["search"].__setitem__("chunk_size", 3000))(p), write_manifest(p)), "RP906", "error", GENAI),
    ("manifest-size", "reference-4K", _write("README.md", b"changed after the build\n"), "RP801", "error", "README.md"),
    ("manifest-incomplete", "reference-4K", lambda p: write_manifest(p, complete=False), "RP801", "error", "manifest.json"),
    ("manifest-extra-file", "reference-4K", _write("notes.txt", b"hi"), "RP801", "warning", "notes.txt"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_check_catches(make_pkg, case):
    _name, profile_id, mutate, check_id, severity, path = case
    pkg = make_pkg(profile_id)
    mutate(pkg)
    result = validate(pkg, profile_id)
    hits = [f for f in result.findings if f.check_id == check_id and f.severity == severity and path in f.path]
    assert hits, f"expected {check_id} {severity} on {path!r}; got {[(f.check_id, f.severity, f.path, f.message) for f in result.findings]}"
    assert all(f.message and f.hint for f in hits)
    assert result.failed() == (severity == "error" or any(f.severity == "error" for f in result.findings))


def test_every_check_has_a_failing_case():
    covered = {c[3] for c in CASES} | {"RP802", "RP902", "RP907"} | {"RP108", "RP407"}  # the tests below; RP108 (a folder name): test_catalog.py; RP407 (--platform linux): test_tune_linux.py
    reference_format = {"RP903", "RP904", "RP905"}  # tests/test_stages/test_fuse.py breaks real fused packages
    advice = {c for c, s in load_all().items() if s.severity == "advice"}  # test_advice.py: a trigger and a quiet case each
    assert covered | reference_format | advice >= set(load_all()), sorted(set(load_all()) - covered)


@pytest.mark.parametrize("profile_id", sorted(p for p, v in all_profiles().items() if v.target == "reference"))
def test_reference_packages_are_real_fused_packages(make_pkg, profile_id):
    """The factory's reference packages come from the fuse stage: raipack's header, every RP90x check run, clean."""
    from raipack.npu import profile as profiles
    from raipack.npu.layout import package_files

    pkg, names = make_pkg(profile_id), package_files(profiles.get(profile_id))  # model.pb.bin, or a hybrid's model_jit.pb.bin
    header = formats.read_header(pkg / names["header"])
    assert header["profile"] == profile_id and header["operators"] and formats.header_problems(header, (pkg / names["weights"]).stat().st_size) == []
    result = validate(pkg, verify_hashes=True)
    assert result.profile == profile_id and result.findings == []
    assert {"RP901", "RP902", "RP903", "RP904", "RP905", "RP906", "RP907"} <= set(result.checks_run)


def test_damaged_header_magic_fails_validate(make_pkg, capsys):
    """One flipped byte of the magic: the folder is still raipack's (its manifest says so), so validate fails on the header."""
    pkg = make_pkg("reference-16K")
    _flip_byte("model.pb.bin")(pkg)
    with pytest.raises(SystemExit) as info:
        main(["validate", str(pkg)])
    out = capsys.readouterr().out
    assert info.value.code == 1, out
    assert "RP901" in out and "model.pb.bin" in out and "RAIPKNPU" in out and "no findings" not in out
    result = validate(pkg)
    assert result.profile == "reference-16K"
    (finding,) = [f for f in result.findings if f.check_id.startswith("RP9")]
    assert (finding.check_id, finding.severity, finding.path) == ("RP901", "error", "model.pb.bin")
    assert "RP902–RP907" in finding.message and "manifest.json says raipack built this package for 1.8.0-npu-16K" in finding.message


def test_damaged_header_fails_under_an_explicit_release_profile(make_pkg):
    """--profile 1.8.0-npu-16K on a package raipack built: its manifest still asks for raipack's header."""
    pkg = make_pkg("reference-16K")
    _header_bytes(0, b"\0" * 8)(pkg)
    result = validate(pkg, "1.8.0-npu-16K")
    assert [(f.check_id, f.path) for f in result.findings if f.severity == "error"] == [("RP901", "model.pb.bin")]


def test_cpu_fallback_is_reported(tmp_path):
    """A real package whose projections could not be fused (the profile allows no group size 128): each runs on the CPU, each is reported."""
    oga, quark = reference_export()
    from raipack.stages.fuse.reference import fuse

    profile = changed(get_profile("reference-4K"), {"quantization": {"allowed_group_sizes": [32, 64]}})
    pkg = tmp_path / "pkg"
    report = fuse(oga, pkg, profile, quark_dir=quark)
    write_manifest(pkg, target_profile="1.8.0-npu-4K")
    left = {n["name"] for n in report["cpu_nodes"] if n["why"] == "not fused"}
    result = validate(pkg)
    hits = [f for f in result.findings if f.check_id == "RP907"]
    assert left and {f.pointer for f in hits} == left
    assert all(f.severity == "warning" and f.path == "model.onnx" and "runs on the CPU" in f.message for f in hits)


def test_verify_hashes_catches_a_flipped_byte(make_pkg):
    pkg = make_pkg("reference-4K")
    assert validate(pkg, verify_hashes=True).findings == []
    _flip_byte("model.bin")(pkg)
    result = validate(pkg, verify_hashes=True)
    first = formats.read_header(pkg / "model.pb.bin")["operators"][0]["tensors"][0]
    assert first["offset"] == 0  # the flipped byte is in the first tensor
    assert [(f.check_id, f.path) for f in result.findings if f.severity == "error"] == [("RP802", "model.bin"), ("RP902", "model.bin")]


def test_verify_hashes_without_records_says_so(make_pkg):
    result = validate(make_pkg(P16), verify_hashes=True)
    assert [(f.check_id, f.severity) for f in result.findings] == [("RP802", "info")]


def test_old_quark_shape_with_lm_head_group_is_accepted(make_pkg):
    pkg = make_pkg(P16)

    def old(d):
        q = d["quantization_config"]
        q["algo_config"] = q["algo_config"][0]
        q["exclude"] = []
        q["layer_quant_config"] = {"lm_head": {"weight": dict(q["global_quant_config"]["weight"], group_size=32)}}
        q["global_quant_config"]["weight"]["ch_axis"] = 1
        del q["version"]

    edit_json(pkg / "config.json", old)
    result = validate(pkg)
    assert [f for f in result.findings if f.check_id in ("RP202", "RP301")] == []


def test_empty_config_json_is_accepted_where_the_profile_allows(make_pkg):
    pkg = make_pkg(P16)
    (pkg / "config.json").write_text("{}")
    result = validate(pkg)
    assert [f for f in result.findings if f.severity == "error"] == []


def test_one_bit_flipped_in_an_exports_model_onnx_is_a_finding_never_a_traceback(tmp_path):
    """Issue 24: a flipped bit in model.onnx gave TypeErrors in pipeline/npu/contract.py (a name protobuf hands back as
    bytes when it is no longer UTF-8 compared with text; a head count attribute turned into a list). A name made
    non-UTF-8 is RP701's unparseable graph; 400 seeded flips anywhere end in findings."""
    import random

    pkg = tmp_path / "export"
    shutil.copytree(reference_export()[0], pkg)
    for p in pkg.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    raw = (pkg / "model.onnx").read_bytes()
    at = raw.index(b"input_ids")
    (pkg / "model.onnx").write_bytes(raw[:at] + bytes([raw[at] ^ 0x80]) + raw[at + 1:])
    found = [(f.check_id, f.severity) for f in validate(pkg).findings]
    assert ("RP701", "error") in found, found
    rng = random.Random(24)
    for _ in range(400):
        data = bytearray(raw)
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        (pkg / "model.onnx").write_bytes(bytes(data))
        validate(pkg)  # any exception fails the test
