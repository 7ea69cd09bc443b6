"""Fuse stage speed (reference backend), measured side by side in one run:

- fuse wall time at the reference-16K profile (every prefill and token tier of the 1.8.0 16K
  release) against a plain copy (`shutil.copyfile`) of as many bytes as fuse wrote, on the same
  disk, page cache warm for both, run in turn (goal: the median ratio at most 1.3x, issue 13);
- reference runtime decode tokens/s against onnxruntime-genai on the unfused export, same model,
  same thread count, 64 greedy tokens after a short prompt (goal: at least 0.8x).

The model is a synthetic onnxruntime-genai int4 export with exactly the builder's node layout (the
graph the fuse stage sees in real builds) and random weights: Llama-shaped, ~1 GB, so bytes dominate
fuse time and matmuls dominate decode time, as they do for real models. It is generated in a few
seconds; nothing is downloaded. Its MatMulNBits carry the `accuracy_level` the export stage writes
(stages/export/builder.py: CPU_FAITHFUL_OPTIONS). bench/big_package.py writes the same graph at
Llama-3.1-8B's dimensions with sparse weights.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests"))

from factory import Dims  # noqa: E402  (the tests' model dimensions; the bench shares them)

THREADS = 2
NEW_TOKENS = 64


def llama_1gb() -> Dims:
    """~1 GB Llama-shaped: bytes dominate fuse time and matmuls dominate decode, as in real models."""
    return Dims(layers=16, heads=32, kv_heads=8, head_size=64, vocab=32000, intermediate=8192, context_length=16384, group_size=128)


def synthetic_export(out: Path, s: Dims, seed: int = 0, sparse: bool = False) -> Path:  # noqa: PLR0915 - the graph written out node by node, as the builder lays it
    """An OGA-builder-shaped int4 decoder (model.onnx + model.onnx.data + genai_config.json).

    `sparse`: the big tensors (quantized weights, scales, zero points, embedding, lm_head) are left
    as holes of the data file (seek, then truncate to the full length) instead of random bytes, so a
    real-dimension model costs no disk and no time to write; fuse reads them as zeros."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from raipack.stages.export.builder import CPU_FAITHFUL_OPTIONS

    accuracy_level = int(CPU_FAITHFUL_OPTIONS["accuracy_level"])  # what the export stage writes
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    H, hs, kvh = s.hidden, s.head_size, s.kv_heads
    data = open(out / "model.onnx.data", "wb")
    pos = 0
    inits = []

    def add(name, dtype, shape, make):
        """A tensor of `dtype` and `shape`; `make()` gives its values (not called for a sparse bulk tensor)."""
        nonlocal pos
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), dims=list(shape))
        pos += (-pos) % 64
        data.seek(pos)
        if make is not None:
            raw = np.ascontiguousarray(make(), dtype=dtype)
            assert raw.nbytes == nbytes, name
            data.write(raw.tobytes())
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", "model.onnx.data"), ("offset", str(pos)), ("length", str(nbytes))):
            e = t.external_data.add()
            e.key, e.value = k, v
        pos += nbytes
        inits.append(t)
        return name

    def bulk(name, dtype, shape, make):
        return add(name, dtype, shape, None if sparse else make)

    def qmatmul(prefix, x, K, N):
        nb = K // s.group_size
        w = bulk(f"{prefix}.qweight", np.uint8, (N, nb, s.group_size // 2), lambda: rng.integers(0, 256, (N, nb, s.group_size // 2), dtype=np.uint8))
        sc = bulk(f"{prefix}.scales", np.float32, (N * nb,), lambda: rng.random(N * nb, dtype=np.float32) * 0.02 / np.sqrt(K / 256))
        zp = bulk(f"{prefix}.qzeros", np.uint8, (N * ((nb + 1) // 2),), lambda: np.full(N * ((nb + 1) // 2), 0x88, np.uint8))
        y = f"{prefix}/output_0"
        nodes.append(helper.make_node("MatMulNBits", [x, w, sc, zp], [y], name=prefix, domain="com.microsoft", K=K, N=N, bits=4, block_size=s.group_size, accuracy_level=accuracy_level))
        return y

    nodes = [
        helper.make_node("Constant", [], ["/model/constants/INT64/[1]"], value=helper.make_tensor("c1", TensorProto.INT64, [1], [1])),
        helper.make_node("ReduceSum", ["attention_mask", "/model/constants/INT64/[1]"], ["/mask/sum"], name="/model/attn_mask_reformat/ReduceSum", keepdims=0),
        helper.make_node("Sub", ["/mask/sum", "/model/constants/INT64/[1]"], ["/mask/sub"], name="/model/attn_mask_reformat/Sub"),
        helper.make_node("Cast", ["/mask/sub"], ["/mask/seqlens_k"], name="/model/attn_mask_reformat/Sub/Cast", to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["/mask/shape"], name="/model/attn_mask_reformat/Shape"),
        helper.make_node("Constant", [], ["/model/constants/INT64/1"], value=helper.make_tensor("c", TensorProto.INT64, [], [1])),
        helper.make_node("Gather", ["/mask/shape", "/model/constants/INT64/1"], ["/mask/total"], name="/model/attn_mask_reformat/Gather", axis=0),
        helper.make_node("Cast", ["/mask/total"], ["/mask/total_seq_len"], name="/model/attn_mask_reformat/Gather/Cast", to=TensorProto.INT32),
    ]
    emb = bulk("model.embed_tokens.weight", np.float32, (s.vocab, H), lambda: rng.standard_normal((s.vocab, H), dtype=np.float32) * 0.5)
    nodes.append(helper.make_node("Gather", [emb, "input_ids"], ["/model/embed_tokens/Gather/output_0"], name="/model/embed_tokens/Gather"))
    inv = 1.0 / (10000 ** (np.arange(0, hs, 2, dtype=np.float32) / hs))
    ang = np.outer(np.arange(s.context_length, dtype=np.float32), inv)
    add("cos_cache", np.float32, ang.shape, lambda: np.cos(ang))
    add("sin_cache", np.float32, ang.shape, lambda: np.sin(ang))
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", s.vocab])]
    residual, x = "/model/embed_tokens/Gather/output_0", None
    for i in range(s.layers):
        p = f"/model/layers.{i}"
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", TensorProto.FLOAT, ["batch_size", kvh, "past_sequence_length", hs]))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", TensorProto.FLOAT, ["batch_size", kvh, "total_sequence_length", hs]))
        g_in = add(f"model.layers.{i}.input_layernorm.weight", np.float32, (H,), lambda: np.ones(H))
        if i == 0:
            nodes.append(helper.make_node("SimplifiedLayerNormalization", [residual, g_in], [f"{p}/input_layernorm/output_0"], name=f"{p}/input_layernorm/LayerNorm", axis=-1, epsilon=1e-6, stash_type=1))
        else:
            nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [residual, x, g_in], [f"{p}/input_layernorm/output_0", "", "", f"{p}/input_layernorm/output_3"], name=f"{p}/input_layernorm/SkipLayerNorm", domain="com.microsoft", epsilon=1e-6))
            residual = f"{p}/input_layernorm/output_3"
        qkv = qmatmul(f"{p}/attn/qkv_proj/MatMulNBits", f"{p}/input_layernorm/output_0", H, (s.heads + 2 * kvh) * hs)
        nodes.append(helper.make_node("GroupQueryAttention", [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value", "/mask/seqlens_k", "/mask/total_seq_len", "cos_cache", "sin_cache"],
                                      [f"{p}/attn/GroupQueryAttention/output_0", f"present.{i}.key", f"present.{i}.value"], name=f"{p}/attn/GroupQueryAttention", domain="com.microsoft",
                                      num_heads=s.heads, kv_num_heads=kvh, scale=1.0 / float(np.sqrt(hs)), local_window_size=-1, softcap=0.0, do_rotary=1, rotary_interleaved=0))
        o = qmatmul(f"{p}/attn/o_proj/MatMulNBits", f"{p}/attn/GroupQueryAttention/output_0", s.heads * hs, H)
        g_post = add(f"model.layers.{i}.post_attention_layernorm.weight", np.float32, (H,), lambda: np.ones(H))
        nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [residual, o, g_post], [f"{p}/post_attention_layernorm/output_0", "", "", f"{p}/post_attention_layernorm/output_3"], name=f"{p}/post_attention_layernorm/SkipLayerNorm", domain="com.microsoft", epsilon=1e-6))
        residual = f"{p}/post_attention_layernorm/output_3"
        gate = qmatmul(f"{p}/mlp/gate_proj/MatMulNBits", f"{p}/post_attention_layernorm/output_0", H, s.intermediate)
        up = qmatmul(f"{p}/mlp/up_proj/MatMulNBits", f"{p}/post_attention_layernorm/output_0", H, s.intermediate)
        nodes += [helper.make_node("Sigmoid", [gate], [f"{p}/mlp/act_fn/Sigmoid/output_0"], name=f"{p}/mlp/act_fn/Sigmoid"),
                  helper.make_node("Mul", [gate, f"{p}/mlp/act_fn/Sigmoid/output_0"], [f"{p}/mlp/act_fn/Mul/output_0"], name=f"{p}/mlp/act_fn/Mul"),
                  helper.make_node("Mul", [f"{p}/mlp/act_fn/Mul/output_0", up], [f"{p}/mlp/Mul/output_0"], name=f"{p}/mlp/Mul")]
        x = qmatmul(f"{p}/mlp/down_proj/MatMulNBits", f"{p}/mlp/Mul/output_0", s.intermediate, H)
    g_final = add(f"model.layers.{s.layers}.final_norm_layernorm.weight", np.float32, (H,), lambda: np.ones(H))
    p = f"/model/layers.{s.layers}/final_norm_layernorm"
    nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [residual, x, g_final], [f"{p}/output_0"], name=f"{p}/SkipLayerNorm", domain="com.microsoft", epsilon=1e-6))
    lm = bulk("lm_head.MatMul.weight", np.float32, (H, s.vocab), lambda: rng.standard_normal((H, s.vocab), dtype=np.float32) * 0.05)
    nodes.append(helper.make_node("MatMul", [f"{p}/output_0", lm], ["logits"], name="/lm_head/MatMul"))
    data.truncate(pos)  # the full length, holes included
    data.close()
    graph = helper.make_graph(nodes, "main_graph", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)], producer_name="raipack-bench")
    model.ir_version = 10
    onnx.save_model(model, str(out / "model.onnx"))
    genai = {
        "model": {"bos_token_id": 1, "context_length": s.context_length, "decoder": {
            "session_options": {"log_id": "onnxruntime-genai", "provider_options": []}, "filename": "model.onnx", "head_size": hs, "hidden_size": H,
            "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask", "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
            "outputs": {"logits": "logits", "present_key_names": "present.%d.key", "present_value_names": "present.%d.value"},
            "num_attention_heads": s.heads, "num_hidden_layers": s.layers, "num_key_value_heads": kvh},
            "eos_token_id": 2, "pad_token_id": 0, "type": "llama", "vocab_size": s.vocab},
        "search": {"diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0, "max_length": s.context_length, "min_length": 0,
                   "no_repeat_ngram_size": 0, "num_beams": 1, "num_return_sequences": 1, "past_present_share_buffer": True, "repetition_penalty": 1.0,
                   "temperature": 1.0, "top_k": 50, "top_p": 1.0},
    }
    (out / "genai_config.json").write_text(json.dumps(genai, indent=4))
    (out / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "num_hidden_layers": s.layers,
                                                 "num_attention_heads": s.heads, "num_key_value_heads": kvh, "vocab_size": s.vocab, "max_position_embeddings": s.context_length,
                                                 "quantization_config": {"quant_method": "quark", "global_quant_config": {"weight": {"dtype": "uint4", "group_size": s.group_size, "symmetric": False}}}}))
    return out


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.2f} s (min {min(xs):.2f}, max {max(xs):.2f})"


def _decoders(export: Path, pkg: Path, prompt: list[int]):
    """(onnxruntime-genai run, reference runtime run): each generates NEW_TOKENS greedy tokens after
    `prompt` and returns decode tokens/s (prefill excluded)."""
    import numpy as np
    import onnxruntime_genai as og

    from raipack.runtime.reference import ReferenceRuntime

    cfg = json.loads((export / "genai_config.json").read_text())
    cfg["model"]["decoder"]["session_options"]["intra_op_num_threads"] = THREADS
    cfg["model"]["decoder"]["session_options"]["inter_op_num_threads"] = 1
    (export / "genai_config.json").write_text(json.dumps(cfg, indent=4))
    model = og.Model(str(export))
    rt = ReferenceRuntime(pkg, threads=THREADS)

    def oga():
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(prompt) + NEW_TOKENS)
        gen = og.Generator(model, params)
        gen.append_tokens(prompt)
        t = time.perf_counter()
        n = 0
        while not gen.is_done():
            gen.generate_next_token()
            n += 1
        return n / (time.perf_counter() - t)

    def ref():
        row = rt.prefill(prompt)
        t = time.perf_counter()
        for _ in range(NEW_TOKENS):
            row = rt.step(int(np.argmax(row)))
        return NEW_TOKENS / (time.perf_counter() - t)

    return oga, ref


def _fuse_row(label: str, export: Path, pkg: Path, profile: dict, report: dict, tmp: Path) -> dict:
    """Fuse against a plain copy of as many bytes as fuse writes, on the same disk, three times in
    turn (fuse, copy, fuse, copy, ...: both see the same machine load); the median of the pairs' ratios."""
    from raipack.stages.fuse.reference import fuse

    written, L = report["bytes_written"], report["lengths"]
    blob, dst = tmp / "copy-src.bin", tmp / "copy-dst.bin"
    with open(blob, "wb") as fh:
        left, chunk = written, os.urandom(16 << 20)
        while left > 0:
            fh.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
    shutil.copyfile(blob, dst)  # warms the page cache, as the first fuse did for fuse
    t_fuse, t_copy = [], []
    try:
        for _ in range(3):
            shutil.rmtree(pkg)  # fuse writes a new or empty folder; removed outside the clock
            t_fuse.append(_timed(lambda: fuse(export, pkg, profile)))
            t_copy.append(_timed(lambda: shutil.copyfile(blob, dst)))
    finally:
        blob.unlink()
        dst.unlink(missing_ok=True)
    ratios = [f / c for f, c in zip(t_fuse, t_copy)]
    ratio = statistics.median(ratios)
    return {"name": f"fuse {label} at 16K (reference backend)", "value": f"{statistics.median(t_fuse):.2f} s", "ratio": ratio,
            "baseline": f"copy of the same {written / 1e9:.2f} GB {_spread(t_copy)}", "goal": "<= 1.3x (median of 3 pairs)", "ok": ratio <= 1.3,
            "note": f"fuse {_spread(t_fuse)}, ratio min {min(ratios):.2f} max {max(ratios):.2f}; profile {profile['id']}, {len(report['fused_nodes'])} fused nodes, "
                    f"{len(L['prefill'])} prefill + {len(L['token'])} token tiers"}


def rows(tmp: Path) -> list[dict]:
    from raipack.npu.profile import get as get_profile
    from raipack.stages.fuse.reference import fuse

    out = []
    for label, shape in (("~1 GB Llama-shaped", llama_1gb()), ("tiny (hidden 256, 2 layers)", Dims(layers=2, heads=4, kv_heads=2, head_size=64, intermediate=512, vocab=512, context_length=16384))):
        export = synthetic_export(tmp / f"export-{shape.layers}", shape)
        profile = get_profile("reference-16K")
        pkg = tmp / f"pkg-{shape.layers}"
        report = fuse(export, pkg, profile)  # warms the page cache and imports
        if shape.layers > 2:
            out.append(_fuse_row(label, export, pkg, profile, report, tmp))
        prompt = [(7 * i) % (shape.vocab - 3) + 3 for i in range(32)]
        run_oga, run_ref = _decoders(export, pkg, prompt)
        pairs = [(run_oga(), run_ref()) for _ in range(5)]  # in turn: both see the same machine load
        ratio = statistics.median(r / o for o, r in pairs)
        oga, ref = statistics.median(o for o, _ in pairs), statistics.median(r for _, r in pairs)
        out.append({"name": f"decode tok/s, {label}", "value": f"{ref:.1f} tok/s", "ratio": ratio,
                    "baseline": f"onnxruntime-genai unfused {oga:.1f} tok/s", "goal": ">= 0.8x (median of 5 pairs)", "ok": ratio >= 0.8,
                    "note": f"{THREADS} threads, {NEW_TOKENS} tokens after a {len(prompt)}-token prompt; medians; "
                            f"reference {min(r for _, r in pairs):.1f}-{max(r for _, r in pairs):.1f}, oga {min(o for o, _ in pairs):.1f}-{max(o for o, _ in pairs):.1f} tok/s"})
    return out


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="raipack-bench-fuse-") as d:
        for row in rows(Path(d)):
            print(row)
