"""Fuse stage speed (reference backend), measured side by side in one run:

- fuse wall time against a plain copy (`shutil.copyfile`) of as many bytes as fuse wrote, on the
  same disk, page cache warm for both (goal: at most 3x);
- reference runtime decode tokens/s against onnxruntime-genai on the unfused export, same model,
  same thread count, 64 greedy tokens after a short prompt (goal: at least 0.8x).

The model is a synthetic onnxruntime-genai int4 export with exactly the builder's node layout (the
graph the fuse stage sees in real builds) and random weights: Llama-shaped, ~1 GB, so bytes dominate
fuse time and matmuls dominate decode time, as they do for real models. It is generated in a few
seconds; nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import shutil
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


def synthetic_export(out: Path, s: Dims, seed: int = 0) -> Path:  # noqa: PLR0915 - the graph written out node by node, as the builder lays it
    """An OGA-builder-shaped int4 decoder (model.onnx + model.onnx.data + genai_config.json)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    H, hs, kvh = s.hidden, s.head_size, s.kv_heads
    data = open(out / "model.onnx.data", "wb")
    pos = 0
    inits = []

    def add(name, arr):
        nonlocal pos
        raw = np.ascontiguousarray(arr)
        t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(raw.dtype), dims=list(raw.shape))
        pad = (-pos) % 64
        data.write(b"\0" * pad)
        pos += pad
        data.write(raw.tobytes())
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", "model.onnx.data"), ("offset", str(pos)), ("length", str(raw.nbytes))):
            e = t.external_data.add()
            e.key, e.value = k, v
        pos += raw.nbytes
        inits.append(t)
        return name

    def qmatmul(prefix, x, K, N):
        nb = K // s.group_size
        w = add(f"{prefix}.qweight", rng.integers(0, 256, (N, nb, s.group_size // 2), dtype=np.uint8))
        sc = add(f"{prefix}.scales", (rng.random(N * nb, dtype=np.float32) * 0.02 / np.sqrt(K / 256)).astype(np.float32))
        zp = add(f"{prefix}.qzeros", np.full(N * ((nb + 1) // 2), 0x88, np.uint8))
        y = f"{prefix}/output_0"
        nodes.append(helper.make_node("MatMulNBits", [x, w, sc, zp], [y], name=prefix, domain="com.microsoft", K=K, N=N, bits=4, block_size=s.group_size, accuracy_level=4))
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
    emb = add("model.embed_tokens.weight", (rng.standard_normal((s.vocab, H), dtype=np.float32) * 0.5))
    nodes.append(helper.make_node("Gather", [emb, "input_ids"], ["/model/embed_tokens/Gather/output_0"], name="/model/embed_tokens/Gather"))
    inv = 1.0 / (10000 ** (np.arange(0, hs, 2, dtype=np.float32) / hs))
    ang = np.outer(np.arange(s.context_length, dtype=np.float32), inv)
    add("cos_cache", np.cos(ang).astype(np.float32))
    add("sin_cache", np.sin(ang).astype(np.float32))
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", s.vocab])]
    residual, x = "/model/embed_tokens/Gather/output_0", None
    for i in range(s.layers):
        p = f"/model/layers.{i}"
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", TensorProto.FLOAT, ["batch_size", kvh, "past_sequence_length", hs]))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", TensorProto.FLOAT, ["batch_size", kvh, "total_sequence_length", hs]))
        g_in = add(f"model.layers.{i}.input_layernorm.weight", np.ones(H, np.float32))
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
        g_post = add(f"model.layers.{i}.post_attention_layernorm.weight", np.ones(H, np.float32))
        nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [residual, o, g_post], [f"{p}/post_attention_layernorm/output_0", "", "", f"{p}/post_attention_layernorm/output_3"], name=f"{p}/post_attention_layernorm/SkipLayerNorm", domain="com.microsoft", epsilon=1e-6))
        residual = f"{p}/post_attention_layernorm/output_3"
        gate = qmatmul(f"{p}/mlp/gate_proj/MatMulNBits", f"{p}/post_attention_layernorm/output_0", H, s.intermediate)
        up = qmatmul(f"{p}/mlp/up_proj/MatMulNBits", f"{p}/post_attention_layernorm/output_0", H, s.intermediate)
        nodes += [helper.make_node("Sigmoid", [gate], [f"{p}/mlp/act_fn/Sigmoid/output_0"], name=f"{p}/mlp/act_fn/Sigmoid"),
                  helper.make_node("Mul", [gate, f"{p}/mlp/act_fn/Sigmoid/output_0"], [f"{p}/mlp/act_fn/Mul/output_0"], name=f"{p}/mlp/act_fn/Mul"),
                  helper.make_node("Mul", [f"{p}/mlp/act_fn/Mul/output_0", up], [f"{p}/mlp/Mul/output_0"], name=f"{p}/mlp/Mul")]
        x = qmatmul(f"{p}/mlp/down_proj/MatMulNBits", f"{p}/mlp/Mul/output_0", s.intermediate, H)
    g_final = add(f"model.layers.{s.layers}.final_norm_layernorm.weight", np.ones(H, np.float32))
    p = f"/model/layers.{s.layers}/final_norm_layernorm"
    nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [residual, x, g_final], [f"{p}/output_0"], name=f"{p}/SkipLayerNorm", domain="com.microsoft", epsilon=1e-6))
    lm = add("lm_head.MatMul.weight", rng.standard_normal((H, s.vocab), dtype=np.float32) * 0.05)
    nodes.append(helper.make_node("MatMul", [f"{p}/output_0", lm], ["logits"], name="/lm_head/MatMul"))
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


def _best(fn, repeat: int, setup=None) -> float:
    """Best wall time of `repeat` calls of fn; `setup` runs before each, outside the clock."""
    best = float("inf")
    for _ in range(repeat):
        if setup is not None:
            setup()
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _decoders(export: Path, pkg: Path, prompt: list[int]):
    """(onnxruntime-genai run, reference runtime run): each generates NEW_TOKENS greedy tokens after
    `prompt` and returns decode tokens/s (prefill excluded)."""
    import numpy as np
    import onnxruntime_genai as og

    from pipeline.runtime.reference import ReferenceRuntime

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


def rows(tmp: Path) -> list[dict]:
    from pipeline.npu.profile import get as get_profile
    from stages.fuse.reference import fuse

    out = []
    for label, shape in (("~1 GB Llama-shaped", llama_1gb()), ("tiny (hidden 256, 2 layers)", Dims(layers=2, heads=4, kv_heads=2, head_size=64, intermediate=512, vocab=512, context_length=16384))):
        export = synthetic_export(tmp / f"export-{shape.layers}", shape)
        profile = get_profile("reference-16K")
        pkg = tmp / f"pkg-{shape.layers}"
        fuse(export, pkg, profile)  # warm the page cache and imports
        report = {}

        def do_fuse(report=report, export=export, pkg=pkg, profile=profile):
            report.update(fuse(export, pkg, profile))

        t_fuse = _best(do_fuse, 3, setup=lambda pkg=pkg: shutil.rmtree(pkg))  # fuse writes a new or empty folder
        written = report["bytes_written"]
        blob = tmp / "copy-src.bin"
        with open(blob, "wb") as fh:
            left, chunk = written, os.urandom(16 << 20)
            while left > 0:
                fh.write(chunk[: min(left, len(chunk))])
                left -= len(chunk)
        dst = tmp / "copy-dst.bin"
        shutil.copyfile(blob, dst)
        t_copy = _best(lambda blob=blob, dst=dst: shutil.copyfile(blob, dst), 3)
        blob.unlink()
        dst.unlink()
        if shape.layers > 2:
            ratio = t_fuse / t_copy
            out.append({"name": f"fuse {label} (reference backend)", "value": f"{t_fuse:.2f} s", "ratio": ratio,
                        "baseline": f"copy of the same {written / 1e9:.2f} GB {t_copy:.2f} s", "goal": "<= 3x", "ok": ratio <= 3.0,
                        "note": f"{len(report['fused_nodes'])} fused nodes, {len(report['lengths']['prefill']) + len(report['lengths']['token'])} tier plans"})
        prompt = [(7 * i) % (shape.vocab - 3) + 3 for i in range(32)]
        run_oga, run_ref = _decoders(export, pkg, prompt)
        oga = ref = 0.0
        for _ in range(5):  # interleaved, best of 5: both see the same machine load
            oga = max(oga, run_oga())
            ref = max(ref, run_ref())
        out.append({"name": f"decode tok/s, {label}", "value": f"{ref:.1f} tok/s", "ratio": ref / oga,
                    "baseline": f"onnxruntime-genai unfused {oga:.1f} tok/s", "goal": ">= 0.8x", "ok": ref / oga >= 0.8,
                    "note": f"{THREADS} threads, {NEW_TOKENS} tokens after a {len(prompt)}-token prompt"})
    return out


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="raipack-bench-fuse-") as d:
        for row in rows(Path(d)):
            print(row)
