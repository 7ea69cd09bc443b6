"""`--numerics bfp16` (issue 26): Quark's BFPQuantizeDequantize against an independent numpy
implementation of its documented kernel, bit for bit; the load-time rewrite of a package's fused
functions; a tiny package's logits under BFP16 against float, by a stated bound.

The numpy kernel follows `quark/onnx/operators/custom_ops/src/bfp/cpu/bfp_kernel.cc` (amd-quark
0.13, MIT) as its comments document it: per block of `block_size` values along the last axis, the
shared exponent is the largest biased exponent (Inf/NaN count as 0), `m_bits = bit_width - 9`,
`scale = 2^(E - 127 - (m_bits - 1))`, each value is rounded at that scale and clamped; Inf/NaN pass
as they are. The compiler-matching variant bumps the exponent once when an element of the largest
exponent rounds to 128 or below -128, and clamps to its own bounds.
"""

from __future__ import annotations

import hashlib
import importlib.util

import numpy as np
import pytest

from factory import reference_package

pytest.importorskip("quark", reason="amd-quark (raipack's build extra) is not installed")

BLOCK, BITS = 8, 16
MODES = (0, 1, 2)  # std::round (half away from zero), half upward, half to even (the one raipack uses)


def _round(q: np.ndarray, mode: int) -> np.ndarray:
    """The kernel's rounding of float32 quotients, in the kernel's own float32 steps (`x - floor(x)`
    is a float32 difference; py3_round returns `floor + 1`, so -0.3 gives +0, not -0)."""
    q = np.asarray(q, np.float32)
    away = np.copysign(np.floor(np.abs(q.astype(np.float64)) + 0.5), q).astype(np.float32)  # std::round keeps the sign of zero
    f = np.floor(q)
    frac = (q - f).astype(np.float32)
    if mode == 0:
        return away
    if mode == 1:
        return np.where((q < 0) & (frac == np.float32(0.5)), np.ceil(q), away)
    odd = np.abs(np.fmod(f, np.float32(2))) == 1
    return np.where(frac > 0.5, f + np.float32(1), np.where((frac == 0.5) & odd, f + np.float32(1), f))


def numpy_bfp(x: np.ndarray, mode: int = 2, compiler: bool = False, bit_width: int = BITS, block: int = BLOCK) -> np.ndarray:
    """BFP quantize-dequantize of float32 `x` in blocks of `block` along its last axis (a multiple of `block`)."""
    x = np.ascontiguousarray(x, np.float32)
    blocks = x.reshape(-1, block)
    exp = ((blocks.view(np.uint32) >> 23) & 0xFF).astype(np.int64)
    shared = np.where(exp == 0xFF, 0, exp).max(axis=1, keepdims=True)
    m_bits = bit_width - 9
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        scale = np.exp2((shared - 127 - (m_bits - 1)).astype(np.float64)).astype(np.float32)
        if compiler:
            first = _round(blocks / scale, mode)
            bump = ((exp == shared) & ((first >= 128) | (first < -128))).any(axis=1, keepdims=True)
            shared = shared + bump
            scale = np.where(bump, (scale.astype(np.float64) * 2).astype(np.float32), scale)
            e = (shared - 127).astype(np.float64)
            hi = (np.exp2(e) * (2.0 ** m_bits - 1)).astype(np.float32)
            lo = (-np.exp2(e) * 2.0 ** m_bits).astype(np.float32)
        else:
            hi = (np.exp2((shared - 127 + 1).astype(np.float64)) - scale.astype(np.float64)).astype(np.float32)
            lo = -hi
        r = (_round(blocks / scale, mode).astype(np.float32) * scale).astype(np.float32)
        out = np.maximum(lo, np.minimum(r, hi))
    out = np.where(exp == 0xFF, blocks, out)
    return out.reshape(x.shape)


def special_values(rng: np.random.Generator, rows: int = 1024, cols: int = 128) -> np.ndarray:
    """≥ 10^5 float32 values in blocks of 8: normal data over 60 decades, zeros, subnormals, the largest
    finite values, Inf/NaN, one-outlier blocks, exact ties at the block's scale and values that round to 128."""
    parts = []
    scales = 10.0 ** rng.uniform(-30, 30, size=(rows, cols // BLOCK, 1))
    parts.append((rng.standard_normal((rows, cols // BLOCK, BLOCK)) * scales).reshape(rows, cols))
    bits = rng.integers(0, 2 ** 32, size=(rows, cols), dtype=np.uint64).astype(np.uint32)
    parts.append(bits.view(np.float32))  # every kind of bit pattern: NaN payloads, Inf, subnormals
    sub = (rng.integers(1, 2 ** 23, size=(rows // 4, cols), dtype=np.uint64).astype(np.uint32) | (rng.integers(0, 2, size=(rows // 4, cols)).astype(np.uint32) << 31))
    parts.append(sub.view(np.float32))  # blocks of subnormals only
    big = np.float32(np.finfo(np.float32).max)
    edge = rng.standard_normal((rows // 4, cols)).astype(np.float32)
    edge[:, ::BLOCK] = big * np.sign(rng.standard_normal(rows // 4))[:, None]  # the largest finite value in every block
    edge[:, 1::BLOCK] = np.float32(np.finfo(np.float32).tiny)  # next to the smallest normal
    edge[: rows // 8, 2::BLOCK] = np.inf
    edge[rows // 8:, 3::BLOCK] = np.nan
    edge[::3, 4::BLOCK] = 0.0
    edge[1::3, 4::BLOCK] = -0.0
    parts.append(edge)
    out = rng.standard_normal((rows // 4, cols)).astype(np.float32)
    out[:, rng.integers(0, BLOCK)::BLOCK] *= np.float32(1e4)  # one large outlier per block
    parts.append(out)
    k = rng.integers(-127, 127, size=(rows // 4, cols)).astype(np.float32)
    ties = (k + np.float32(0.5)) * np.float32(2.0 ** -6)  # exactly half way at the scale of a block led by 1.x
    ties[:, ::BLOCK] = np.float32(1.5)
    parts.append(ties)
    near = (np.float32(1.0) + rng.uniform(0.985, 1.0, size=(rows // 4, cols)).astype(np.float32)) * np.float32(2.0 ** rng.integers(-100, 100))
    parts.append(near.astype(np.float32))  # block leaders whose quotient rounds to 128
    zero = np.zeros((rows // 8, cols), np.float32)
    parts.append(zero)
    return np.concatenate([p.astype(np.float32) for p in parts]).astype(np.float32)


@pytest.fixture(scope="module")
def quark_op():
    """run(x, mode, compiler) through Quark's compiled BFPQuantizeDequantize on the CPU provider."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from raipack.runtime.numerics import quark_library

    lib = quark_library()
    sessions = {}

    def run(x: np.ndarray, mode: int, compiler: bool) -> np.ndarray:
        key = (mode, compiler)
        if key not in sessions:
            node = helper.make_node("BFPQuantizeDequantize", ["x"], ["y"], domain="com.amd.quark", bfp_method="to_bfp", axis=-1,
                                    bit_width=BITS, block_size=BLOCK, rounding_mode=mode, use_compiler_version_cpu_kernel=int(compiler))
            graph = helper.make_graph([node], "bfp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.amd.quark", 1)])
            so = ort.SessionOptions()
            so.register_custom_ops_library(str(lib))
            sessions[key] = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return sessions[key].run(None, {"x": x})[0]

    return run


@pytest.fixture(scope="module")
def values():
    x = special_values(np.random.default_rng(26))
    assert x.size >= 10 ** 5
    return x


@pytest.mark.parametrize("compiler", [False, True], ids=["kernel", "compiler-kernel"])
@pytest.mark.parametrize("mode", MODES)
def test_quark_op_matches_numpy_kernel_bit_for_bit(quark_op, values, mode, compiler):
    got = quark_op(values, mode, compiler)
    want = numpy_bfp(values, mode, compiler)
    bad = got.view(np.uint32) != want.view(np.uint32)
    assert not bad.any(), f"{bad.sum()} of {values.size} differ; first input {values[bad][:4]} op {got[bad][:4]} numpy {want[bad][:4]}"


def test_the_cases_the_kernel_treats_specially_are_in_the_data(values):
    """The bit-exact test is only as good as its data: each special case is present and does what the kernel says."""
    exp = (values.view(np.uint32) >> 23) & 0xFF
    assert (values == 0).sum() > 1000 and ((exp == 0) & (values != 0)).sum() > 1000  # zeros, subnormals
    assert np.isnan(values).sum() > 100 and np.isinf(values).sum() > 100
    assert (np.abs(values) == np.finfo(np.float32).max).sum() > 100
    normal, bumped = numpy_bfp(values, 2, False), numpy_bfp(values, 2, True)
    assert (normal.view(np.uint32) != bumped.view(np.uint32)).sum() > 1000  # the two variants do differ (the bump)
    assert (numpy_bfp(values, 0).view(np.uint32) != normal.view(np.uint32)).any()  # ties are hit: modes differ
    nan = np.isnan(values)
    assert np.array_equal(normal[nan].view(np.uint32), values[nan].view(np.uint32))  # NaN passes as it is


def test_numpy_kernel_on_a_hand_worked_block():
    """A block led by 1.99 (biased exponent 127, scale 2^-6): 1/3 -> 21/64; 2^-7 is half a step -> 0
    (to even); -0.75 exact; 1e-30 vanishes; 1.9921875 is 127.5 steps -> 128, clamped to 127 steps."""
    x = np.array([[1.0, 1.0 / 3, 2.0 ** -7, 2.0 ** -8, -0.75, 1e-30, 0.0, 1.9921875]], np.float32)
    want = np.array([[1.0, 21 / 64, 0.0, 0.0, -0.75, 0.0, 0.0, 127 / 64]], np.float32)
    assert np.array_equal(numpy_bfp(x), want)
    assert numpy_bfp(x, compiler=True)[0, 7] == 2.0  # the compiler variant bumps the exponent instead


# ------------------------------------------------------------------------------ the rewrite


def test_rewrite_rounds_every_npu_matmul_and_attention_input_only_inside_fused_functions():
    import onnx

    from raipack.runtime.numerics import rewrite

    pkg = reference_package("reference-4K")
    model = onnx.load(str(pkg / "model.onnx"), load_external_data=False)
    new, counts = rewrite(model, "bfp16")
    assert counts["bfp16"] > 0 and counts["bfloat16"] > 0
    assert [n.op_type for n in new.graph.node] == [n.op_type for n in model.graph.node]  # the CPU side is untouched
    for func in new.functions:
        produced = {o: n for n in func.node for o in n.output}
        for node in func.node:
            if node.op_type == "MatMulNBits" or node.op_type == "GroupQueryAttention":
                src = produced.get(node.input[0])
                assert src is not None and src.op_type == "Cast" and produced[src.input[0]].op_type == "BFPQuantizeDequantize", (func.name, node.name)
            if node.op_type == "GroupQueryAttention":
                assert all(produced[node.input[k]].op_type == "Cast" for k in (7, 8))  # the rotary cache in bfloat16
    assert rewrite(model, "float")[1] == {"bfp16": 0, "bfloat16": 0}


def test_bfp16_run_changes_logits_within_the_stated_bound_and_leaves_the_package_alone():
    """Stated bound: on the tiny package the BFP16 logits differ from the float ones, by at most 1 % of
    the largest float logit (measured 0.10 % on 8 steps)."""
    from raipack.runtime.reference import ReferenceRuntime

    pkg = reference_package("reference-4K")
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in pkg.iterdir() if p.is_file()}
    ids = list(range(5, 45))
    tf, rf = ReferenceRuntime(pkg).generate(ids, 8, return_logits=True)
    rt = ReferenceRuntime(pkg, numerics="bfp16")
    tb, rb = rt.generate(ids, 8, return_logits=True)
    rf, rb = np.array(rf), np.array(rb)
    assert np.isfinite(rb).all()
    diff = np.abs(rf - rb).max()
    assert diff > 0, "BFP16 changed nothing: the rewrite did not take effect"
    assert diff <= 0.01 * np.abs(rf).max(), (diff, np.abs(rf).max())
    assert not (rt._kv.view(np.uint32) & 0xFFFF).any()  # every KV position the run wrote is held in bfloat16
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in pkg.iterdir() if p.is_file()}
    assert after == before


def test_round_bfloat16_is_round_to_nearest_even():
    from raipack.runtime.numerics import round_bfloat16

    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 1 + 2 ** -8 + 2 ** -20, np.inf, np.nan, 3.0e38], np.float32)
    round_bfloat16(x)
    assert x[0] == 1.0 and x[1] == 1 + 2 ** -6 and x[2] == -1.0 and x[3] == 1 + 2 ** -7
    assert np.isinf(x[4]) and np.isnan(x[5]) and np.isfinite(x[6])


def test_without_quark_bfp16_is_one_sentence_exit_2(monkeypatch, tmp_path, capsys):
    from raipack.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "quark" else real(name, *a))
    pkg = reference_package("reference-4K")
    with pytest.raises(SystemExit) as done:
        main(["run", str(pkg), "-p", "hi", "--numerics", "bfp16"])
    err = capsys.readouterr().err
    assert done.value.code == 2
    assert "--numerics bfp16 needs amd-quark" in err and "build extra" in err and "Traceback" not in err


# ------------------------------------------------------------------------------ the smoke stage's perplexities


def test_smoke_records_the_package_perplexity_under_float_and_bfp16(monkeypatch):
    """The float number is the export's on the same window (the fused package computes what the export
    does); the BFP16 one differs, and both reach the quality record the report shows. A 128-token
    window here (the stage's is 256) keeps the test fast."""
    import contextlib

    monkeypatch.setattr("raipack.runtime.heldout.MAX_TOKENS", 128)

    from factory import reference_export
    from raipack.runtime.chat import chat_ids, load_tokenizer
    from raipack.runtime.heldout import heldout_ids
    from raipack.runtime.ortloop import OrtDecoder, perplexity
    from raipack.runtime.reference import ReferenceRuntime
    from raipack.stages.smoke.device import Asked, device_run, float_perplexity
    from raipack.stages.smoke.stage import SmokeConfig, _summarize

    pkg, oga = reference_package("reference-4K"), reference_export()[0]
    tok = load_tokenizer(pkg)
    rt = ReferenceRuntime(pkg)
    report = {"device": "cpu-reference", "answer": "x", "tokens_match_export": True, "numerics": "bfp16"}

    class Quiet:
        def task(self, *a, **k):
            return contextlib.nullcontext(lambda n=1: None)

    window = float_perplexity(report, rt, tok, Quiet())
    fixed = chat_ids(tok, "What is the capital of France?")
    float_answer = rt.generate(fixed, 4)
    device_run(report, pkg, tok, Asked(fixed, window, float_answer, 4), SmokeConfig(max_new_tokens=4), Quiet())
    ids = heldout_ids(tok, rt.max_length - 1)
    assert window == ids
    assert report["ppl_window_tokens"] == len(ids) == 128
    assert report["ppl_package"] == pytest.approx(perplexity(OrtDecoder(oga).logits(ids), ids), rel=1e-4)
    assert np.isfinite(report["ppl_package_bfp16"]) and report["ppl_package_bfp16"] != report["ppl_package"]
    assert isinstance(report["numerics_changed_answer"], bool) and report["answer_bfp16_tokens"] <= 4  # against the float answer's first 4 tokens
    done = _summarize(report)
    q = done["quality"]
    assert {"numerics", "ppl_package", "ppl_package_bfp16", "answer_bfp16", "numerics_changed_answer", "numerics_note"} <= set(q)
    assert done["summary"].startswith("cpu-reference (BFP16, predicted): ")  # the device's answer heads the stage's line
    assert q["numerics_note"] == "BFP16 as Quark defines it; the NPU's exact arithmetic is not published"


@pytest.mark.parametrize("where", ["package", "relative"])
def test_quark_library_from_the_package_or_the_working_directory_is_refused(tmp_path, monkeypatch, where):
    from raipack.core.errors import RaipackError
    from raipack.runtime import numerics

    pkg = tmp_path / "pkg"
    (pkg / "ext").mkdir(parents=True)
    planted = pkg / "ext" / "quark_custom_ops_stable_abi.so"
    planted.write_bytes(b"\x7fELF")
    import quark.onnx.operators.custom_ops as ops

    monkeypatch.setattr(ops, "get_library_path", lambda device="CPU": str(planted))
    if where == "relative":
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "ext")
        monkeypatch.chdir(pkg)
        match = "TORCH_EXTENSIONS_DIR is the relative path 'ext'"
    else:
        monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
        match = "inside .*pkg: raipack never loads a library from a package"
    with pytest.raises(RaipackError, match=match):
        numerics.quark_library(untrusted=(pkg,))
