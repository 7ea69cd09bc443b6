"""Generate model packages shaped like each profile (fixtures are made, never downloaded).

`make_package(root, profile_id)` writes a package that validates clean under
that profile: small real ONNX graphs with the OGA input/output contract and a
MatMulNBits node whose weights are external data, consistent configs, a
tokenizer, NPU weight files, cache meta files and metastate sets. `Dims`
scales it; `sparse=True` writes weight files as sparse files of the real size
(an 8B-shaped package costs no disk).

raipack's own reference profiles are never imitated: their packages are copies
of real ones, fused by stages/fuse/reference.py from a tiny model exported by
the OGA builder (`reference_package`), built once per test run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import amd_header
from raipack.checks.consistency import sliding_layers
from raipack.data import load_data
from raipack.npu.layout import weights_sibling
from raipack.npu.profile import get as get_profile
from raipack.npu.spec import Profile
from seed_models import FAMILIES

QUARK_CONFIG = {
    "algo_config": [{"name": "awq", "model_decoder_layers": "model.layers", "scaling_layers": [
        {"prev_op": "input_layernorm", "layers": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], "inp": "self_attn.q_proj", "module2inspect": "self_attn"},
        {"prev_op": "self_attn.v_proj", "layers": ["self_attn.o_proj"], "inp": "self_attn.o_proj"},
        {"prev_op": "post_attention_layernorm", "layers": ["mlp.gate_proj", "mlp.up_proj"], "inp": "mlp.gate_proj", "module2inspect": "mlp"},
        {"prev_op": "mlp.up_proj", "layers": ["mlp.down_proj"], "inp": "mlp.down_proj"}]}],
    "exclude": ["lm_head"],
    "export": {"kv_cache_group": [], "min_kv_scale": 0.0, "pack_method": "reorder", "weight_format": "real_quantized", "weight_merge_groups": None},
    "global_quant_config": {
        "weight": {"dtype": "uint4", "qscheme": "per_group", "group_size": 128, "symmetric": False, "ch_axis": -1, "observer_cls": "PerGroupMinMaxObserver", "round_method": "half_even", "scale_type": "float", "is_dynamic": False, "zero_point_type": "int32"},
        "input_tensors": None, "output_tensors": None, "bias": None, "target_device": None},
    "kv_cache_post_rope": False, "kv_cache_quant_config": {}, "layer_quant_config": {}, "layer_type_quant_config": {},
    "quant_method": "quark", "quant_mode": "eager_mode", "softmax_quant_spec": None, "version": "0.13",
}


@dataclass
class Dims:
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_size: int = 32
    vocab: int = 320
    intermediate: int = 256
    context_length: int = 131072
    tokenizer_vocab: int | None = None  # defaults to vocab (a tokenizer.json of that many tokens)
    group_size: int = 128
    hidden_size: int | None = None  # where the config's head_dim is not hidden / heads (Gemma 3, Qwen3 beyond 1.7B)

    @property
    def hidden(self) -> int:
        return self.hidden_size or self.heads * self.head_size


LLAMA_8B = Dims(layers=32, heads=32, kv_heads=8, head_size=128, vocab=128256, intermediate=14336, tokenizer_vocab=128256)


@dataclass
class Layout:
    """File names of one package generation."""

    graph: str = "model.onnx"
    data: str = "model.onnx.data"
    header: str | None = "model.pb.bin"
    cache: str | None = "cache"
    extra: list[str] = field(default_factory=list)


def layout_for(profile: Profile, name: str = "Model") -> Layout:
    pid = profile.id
    if pid == "1.3-hybrid":
        return Layout(f"{name}_jit.onnx", f"{name}_jit.onnx.data", f"{name}_jit.pb.bin", None)
    if pid == "1.3-npu":
        return Layout("model.onnx", "model.data", None, None, ["prompts.txt"])
    if pid == "1.6-npu":
        return Layout("fusion.onnx", "fusion.onnx.data", "prefill.pb.bin", ".cache")
    if profile.target == "hybrid":
        return Layout("model_jit.onnx", "model_jit.onnx.data", "model_jit.pb.bin", None)
    if profile.target == "intermediate":
        return Layout("model.onnx", "model.onnx.data", None, None)
    return Layout()


def folder_name(profile: Profile, model: str = "Llama-3.2-1B-Instruct") -> str:
    patterns = profile.detect.name_patterns
    return patterns[0].replace("*", model) if patterns else f"{model}-{profile.id}"


# -- the graph ---------------------------------------------------------------

def make_graph(d: Dims, *, block_size: int | None = None, bits: int = 4, quantize_lm_head: bool = False) -> onnx.ModelProto:
    """An OGA-shaped decoder: real I/O contract, one MatMulNBits per layer, external weights."""
    block = block_size or d.group_size
    H, kvh, hs = d.hidden, d.kv_heads, d.head_size
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", d.vocab])]
    nodes, inits = [], []
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((min(d.vocab, 512), H)).astype(np.float32)
    inits.append(numpy_helper.from_array(emb, "model.embed_tokens.weight"))
    nodes.append(helper.make_node("Gather", ["model.embed_tokens.weight", "input_ids"], ["/model/embed_tokens/Gather/output_0"], name="/model/embed_tokens/Gather"))
    x = "/model/embed_tokens/Gather/output_0"
    for i in range(d.layers):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", TensorProto.FLOAT, ["batch_size", kvh, "past_sequence_length", hs]))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", TensorProto.FLOAT, ["batch_size", kvh, "total_sequence_length", hs]))
            nodes.append(helper.make_node("Identity", [f"past_key_values.{i}.{kind}"], [f"present.{i}.{kind}"], name=f"/model/layers.{i}/attn/{kind}_cache"))
        prefix = f"/model/layers.{i}/mlp/down_proj/MatMul"
        K, N = H, H
        nb = (K + block - 1) // block
        w = np.full((N, nb, block * bits // 8), 0x5A, dtype=np.uint8)  # cheap at 8B sizes; content is not checked
        inits += [numpy_helper.from_array(w, f"{prefix}.weight_Q4"),
                  numpy_helper.from_array(np.ones((N * nb,), np.float32), f"{prefix}.weight_scales"),
                  numpy_helper.from_array(np.full((N * ((nb + 1) // 2),), 0x88, np.uint8), f"{prefix}.weight_zp")]
        nodes.append(helper.make_node("MatMulNBits", [x, f"{prefix}.weight_Q4", f"{prefix}.weight_scales", f"{prefix}.weight_zp"], [f"{prefix}/output_0"], name=prefix, domain="com.microsoft", K=K, N=N, bits=bits, block_size=block, accuracy_level=4))
        x = f"{prefix}/output_0"
    if quantize_lm_head:
        nb = (H + block - 1) // block
        inits += [numpy_helper.from_array(np.zeros((d.vocab, nb, block // 2), np.uint8), "lm_head.MatMul.weight_Q4"),
                  numpy_helper.from_array(np.ones((d.vocab * nb,), np.float32), "lm_head.MatMul.weight_scales")]
        nodes.append(helper.make_node("MatMulNBits", [x, "lm_head.MatMul.weight_Q4", "lm_head.MatMul.weight_scales"], ["logits"], name="/lm_head/MatMul", domain="com.microsoft", K=H, N=d.vocab, bits=4, block_size=32))
    else:
        inits.append(numpy_helper.from_array(rng.standard_normal((H, min(d.vocab, 512))).astype(np.float32), "lm_head.weight"))
        nodes.append(helper.make_node("MatMul", [x, "lm_head.weight"], ["logits"], name="/lm_head/MatMul"))
    graph = helper.make_graph(nodes, "decoder", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)], producer_name="raipack-tests")
    model.ir_version = 10
    return model


def save_graph(model: onnx.ModelProto, root: Path, graph_name: str, data_name: str) -> None:
    """Every initializer goes to one external data file, as the OGA builder writes it."""
    onnx.save_model(model, str(root / graph_name), save_as_external_data=True, all_tensors_to_one_file=True, location=data_name, size_threshold=0)


# -- configs -----------------------------------------------------------------

def genai_config(profile: Profile, d: Dims, lay: Layout, max_length: int | None = None) -> dict:
    search_defaults = {"diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0, "max_length": 4096, "min_length": 0,
                       "no_repeat_ngram_size": 0, "num_beams": 1, "num_return_sequences": 1, "past_present_share_buffer": True, "repetition_penalty": 1.0,
                       "temperature": 0.6, "top_k": 50, "top_p": 0.9}
    search = dict(search_defaults, **profile.genai.search)
    if max_length:
        search["max_length"] = max_length
    opts = {}
    if profile.target == "hybrid" and profile.genai.form == "provider_options":
        # AMD's 1.7+ hybrid packages (AMD_PACKAGES.md §2): no hybrid_opt_token_backend (npu would make it an NPU package)
        opts = {"external_data_file": lay.header, "hybrid_opt_free_after_prefill": "1", "hybrid_opt_max_seq_length": "4096"}
    for key, rule in profile.genai.options.items() if not opts else ():
        if rule.allowed:
            opts[key] = rule.allowed[-1] if key != "external_data_file" else rule.allowed[0]
        elif key == "external_data_file":
            opts[key] = lay.header
        elif key in ("hybrid_opt_max_seq_length",):
            opts[key] = "4096"
        elif key == "max_length_for_kv_cache":
            opts[key] = str(search["max_length"])
        elif key == "custom_ops_library":
            opts[key] = "onnx_custom_ops.dll"
        elif key == "hybrid_opt_chunk_context_threshold":
            opts[key] = "1"
        elif rule.required:
            opts[key] = "1"
    session = {"log_id": "onnxruntime-genai", "provider_options": []}
    form = profile.genai.form
    if form == "session_options":
        entries = {k: v for k, v in opts.items() if k.startswith(("hybrid_opt", "max_length_for"))}
        session.update({k: v for k, v in opts.items() if k not in entries})
        if entries:
            session["config_entries"] = entries
    elif form == "provider_options":
        session["provider_options"] = [{"RyzenAI": opts}]
    return {
        "model": {
            "bos_token_id": 1, "context_length": d.context_length,
            "decoder": {
                "session_options": session, "filename": lay.graph, "head_size": d.head_size, "hidden_size": d.hidden,
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask", "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key", "present_value_names": "present.%d.value"},
                "num_attention_heads": d.heads, "num_hidden_layers": d.layers, "num_key_value_heads": d.kv_heads,
            },
            "eos_token_id": [2, 3], "pad_token_id": 2, "type": "llama", "vocab_size": d.vocab,
        },
        "search": search,
    }


def model_config(d: Dims, with_quant: bool) -> dict:
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": d.hidden, "intermediate_size": d.intermediate,
           "num_hidden_layers": d.layers, "num_attention_heads": d.heads, "num_key_value_heads": d.kv_heads, "head_dim": d.head_size,
           "vocab_size": d.vocab, "max_position_embeddings": d.context_length, "tie_word_embeddings": False, "torch_dtype": "float32"}
    if with_quant:
        q = json.loads(json.dumps(QUARK_CONFIG))
        q["global_quant_config"]["weight"]["group_size"] = d.group_size
        cfg["quantization_config"] = q
    return cfg


def tokenizer_json(n: int) -> dict:
    specials = ["<unk>", "<s>", "</s>", "<|eot|>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for i in range(len(specials), n):
        vocab[f"t{i}"] = i
    return {"version": "1.0", "added_tokens": [{"id": i, "content": t, "special": True, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False} for i, t in enumerate(specials)],
            "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}, "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "vocab": vocab, "merges": []}}


@lru_cache(maxsize=8)
def tokenizer_text(n: int) -> str:
    """tokenizer_json(n) as a file's text, unindented: a real-size vocabulary (150K-260K tokens) indented
    took a second per package."""
    return json.dumps(tokenizer_json(n))


# -- files -------------------------------------------------------------------

def write_json(path: Path, doc) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2))


def write_blob(path: Path, size: int, sparse: bool, seed: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        if sparse:
            fh.truncate(size)
        else:
            fh.write(np.random.default_rng(seed).integers(0, 255, size, dtype=np.uint8).tobytes())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Sizes:
    """The sizes of a made package's large files, for size-shaped tests."""

    sparse: bool = False  # written as holes, not bytes
    npu_bytes: int = 4096  # model.bin (the NPU weights)
    data_bytes: int = 0  # the graph's external data file grown to this size


def make_package(root: Path, profile_id: str, d: Dims | None = None, *, name: str | None = None, max_length: int | None = None, **sizes) -> Path:
    """Write a package that validates clean under `profile_id`; return its folder.

    `root` is the parent; the folder is named like the real packages of the
    profile unless `name` is given. `sizes` are Sizes' fields (data_bytes=1 << 30, sparse=True).
    """
    chosen = Sizes(**sizes)
    sparse, npu_bytes, data_bytes = chosen.sparse, chosen.npu_bytes, chosen.data_bytes
    profile = get_profile(profile_id)
    pkg = Path(root) / (name or folder_name(profile))
    if profile.target == "reference":
        if (d, sparse, npu_bytes, data_bytes, max_length) != (None, False, 4096, 0, None):
            raise ValueError(f"{profile_id} packages are copies of one real fused package; they take no dimensions or sizes")
        shutil.copytree(reference_package(profile_id), pkg, dirs_exist_ok=True)
        return pkg
    if profile.target == "model-package":  # an ONNX Runtime model package: the 4K reference package and its export
        shutil.copytree(model_package(), pkg, dirs_exist_ok=True)
        return pkg
    d = d or Dims()
    pkg.mkdir(parents=True, exist_ok=True)
    lay = layout_for(profile)
    if profile.id in ("hf-source", "quark-export"):
        write_safetensors(pkg / "model.safetensors", {"lm_head.weight": np.zeros((4, 4), np.float32)})
    else:
        save_graph(make_graph(d), pkg, lay.graph, lay.data)
    if data_bytes:
        with open(pkg / lay.data, "r+b") as fh:
            fh.truncate(max(data_bytes, os.path.getsize(pkg / lay.data)))
    if profile.genai.form != "builder" or profile.id == "oga-export":
        write_json(pkg / "genai_config.json", genai_config(profile, d, lay, max_length))
    amd_hybrid = profile.target == "hybrid" and profile.genai.form == "provider_options"  # AMD ships config.json = {}
    write_json(pkg / "config.json", {} if amd_hybrid else model_config(d, profile.quantization.config_json == "quark" or profile.target != "intermediate"))
    (pkg / "tokenizer.json").write_text(tokenizer_text(d.tokenizer_vocab or min(d.vocab, 320)))
    write_json(pkg / "tokenizer_config.json", {"bos_token": "<s>", "eos_token": "</s>", "model_max_length": d.context_length, "tokenizer_class": "PreTrainedTokenizerFast"})
    write_json(pkg / "generation_config.json", {"bos_token_id": 1, "eos_token_id": [2, 3], "do_sample": True, "temperature": 0.6, "top_p": 0.9})
    if profile.target != "intermediate":
        write_json(pkg / "rai_config.json", {"max_prompt_length": {v: min(n, 4096) for v, n in profile.max_prompt_length.items()}})
    for extra in lay.extra:
        (pkg / extra).write_text("What is the capital of France?\n")
    if lay.header:
        write_blob(pkg / weights_sibling(lay.header), npu_bytes, sparse, 1)
        (pkg / lay.header).write_bytes(amd_header.header_bytes(weights_sibling(lay.header), [("MatMulNBits_0", 0, npu_bytes)], size=256))
    if lay.cache:
        _cache(pkg / lay.cache, d, sparse)
        _release_extras(pkg, profile, lay.cache)
    if profile.metastate.required or profile.metastate.siblings:
        _metastate(pkg, profile, d, max_length)
    write_hub_gitattributes(pkg)
    return pkg


AMD_GITATTRIBUTES = Path(__file__).resolve().parent / "data" / "amd_gitattributes.txt"


def write_hub_gitattributes(pkg: Path) -> None:
    """The .gitattributes a package has on the Hub, as AMD's folders have it: the Hub's default LFS
    patterns (the first lines of tests/data/amd_gitattributes.txt), then one line per file the Hub put
    into LFS for its size (over 10 MiB, or binary over 1 MB), as the Hub's upload adds them."""
    from raipack.core import lfs

    lines = [line for line in AMD_GITATTRIBUTES.read_text().splitlines() if line.startswith("*") or line.startswith("saved_model")]
    attrs = lfs.Attributes({lfs.NAME: "\n".join(lines)})
    for rel, size in sorted(lfs.sizes_of(pkg).items()):
        if attrs.in_lfs(rel) or size <= lfs.binary_limit():
            continue
        with open(pkg / rel, "rb") as fh:
            binary = b"\0" in fh.read(lfs.BINARY_PROBE)
        if size > lfs.limit() or binary:
            lines.append(lfs.rule_line(lfs.escape_glob(rel)))
    (pkg / lfs.NAME).write_text("\n".join(lines) + "\n")


def _cache(folder: Path, d: Dims, sparse: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(d.layers):
        node = f"MatMulNBits_{i}_0"
        consts = {}
        for t in ("wts", "scales"):
            fname = f"{node}_{t}.const"
            size = 1024 if t == "wts" else 256
            write_blob(folder / fname, size, sparse, i)
            consts[t] = {"file_name": fname, "file_size": size}
        write_json(folder / f"{node}_meta.json", {
            "dd_meta_major_version": 1, "dd_meta_minor_version": 4,
            "op_list": [{"name": node, "type": "MladfMatMul", "attrs": {"bits": 4, "block_size": d.group_size, "K": d.hidden, "N": d.hidden, "total_seq_len": 4096}}],
            "tensor_map": consts, "state_table_updates": []})


def _release_extras(pkg: Path, profile: Profile, cache: str) -> None:
    """The files a release's runtime opens beyond the profile's list (pipeline/data/runtime_files.json)."""
    import fnmatch
    import zipfile

    for extra in load_data("runtime_files.json")["extra"]:
        if any(fnmatch.fnmatchcase(profile.id, p) for p in extra["profiles"]):
            with zipfile.ZipFile(pkg / extra["file"].format(cache=cache), "w") as zf:
                zf.writestr("txn_0.bin", b"\0" * 64)


def _metastate(pkg: Path, profile: Profile, d: Dims, max_length: int | None) -> None:
    spec = profile.metastate
    exts = spec.siblings or ["state"]
    if spec.tiered:
        ml = max_length or profile.genai.search.get("max_length", 4096)
        for phase, key in (("Prefill", "prefill"), ("Token", "token")):
            for tier in profile.buckets.of(key):
                if tier <= ml:
                    for ext in exts:
                        write_json(pkg / f"dd_metastate_Llm_{phase}_decoder_{tier}.{ext}", {"tier": tier, "phase": phase})
        return
    for phase in ("Prefill", "Token"):
        for i in range(d.layers):
            for ext in exts:
                write_blob(pkg / f"dd_metastate_Llm_{phase}_MatMulNBits_{i}_0.{ext}", 64, False, i)


def write_manifest(pkg: Path, kind: str = "package", complete: bool = True, target_profile: str | None = None) -> None:
    files = []
    for path in sorted(p for p in pkg.rglob("*") if p.is_file() and p.name != "manifest.json"):
        rel = path.relative_to(pkg).as_posix()
        from raipack.core.package import role_of

        files.append({"path": rel, "size": path.stat().st_size, "sha256": sha256(path), "role": role_of(rel)})
    write_json(pkg / "manifest.json", {
        "format": "raipack-manifest", "format_version": 1, "generator": {"name": "raipack", "version": "0.1.0"}, "kind": kind,
        "stage": None, "created": "2026-12-01T00:00:00Z", "files": files, "tools": {"raipack": "0.1.0"}, "complete": complete,
        **({"target_profile": target_profile} if target_profile else {})})


def write_safetensors(path: Path, tensors: dict) -> None:
    """A real safetensors file (header length, JSON header, raw little-endian data)."""
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": {"float32": "F32", "int32": "I32"}[str(arr.dtype)], "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(len(head).to_bytes(8, "little") + head + b"".join(blobs))


def lfs_pointer_text(data_size: int, oid: str = "a" * 64) -> str:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {data_size}\n"


# -- real-size packages of the model families (tests/data/seeds.json, families.json) --

def real_dims(family: str) -> Dims:
    c = FAMILIES[family]["config"]
    head = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return Dims(layers=c["num_hidden_layers"], heads=c["num_attention_heads"], kv_heads=c["num_key_value_heads"], head_size=head,
                vocab=c["vocab_size"], intermediate=c["intermediate_size"], context_length=c["max_position_embeddings"], tokenizer_vocab=c["vocab_size"],
                hidden_size=c["hidden_size"])


def params(family: str) -> int:
    c = FAMILIES[family]["config"]
    h, i, n, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    head = c.get("head_dim") or h // c["num_attention_heads"]
    attn = h * head * (c["num_attention_heads"] * 2 + c["num_key_value_heads"] * 2)
    return n * (attn + 3 * h * i + 2 * h) + v * h * (1 if c["tie_word_embeddings"] else 2) + h


def sliding_block(config: dict) -> dict | None:
    """genai_config.json's decoder `sliding_window`, as the OGA builder writes it, for a model whose
    window is shorter than its context (Mistral v0.1, Gemma 3); None for the others."""
    window, local = sliding_layers(config)
    if not local or window >= config["max_position_embeddings"]:
        return None
    return {"window_size": window, "slide_key_value_cache": False, "slide_inputs": False, "layers": local}


def real_size_package(root, name: str, spec: dict) -> Path:
    """The AMD package `name` of `spec` (its family in tests/data/seeds.json or families.json, and its
    profile) at the real checkpoint's dimensions and config, weights files sparse."""
    family = FAMILIES[spec["family"]]
    n = params(spec["family"])
    emb = family["config"]["vocab_size"] * family["config"]["hidden_size"]
    pkg = make_package(root, spec["profile"], real_dims(spec["family"]), sparse=True, name=name,
                       npu_bytes=(n - emb) // 2 + (n - emb) // 64,  # uint4 payload + scales and zero points
                       data_bytes=emb * 2)  # the bfloat16 embedding stays on the CPU side
    cfg = json.loads((pkg / "config.json").read_text())
    if cfg:  # AMD's hybrid packages ship config.json = {}
        write_json(pkg / "config.json", {**family["config"], "quantization_config": cfg["quantization_config"]})
    genai = json.loads((pkg / "genai_config.json").read_text())
    genai["model"]["type"] = family["config"]["model_type"]
    if block := sliding_block(family["config"]):
        genai["model"]["decoder"]["sliding_window"] = block
    over = get_profile(spec["profile"]).model_overrides.get(family["config"]["model_type"], {})
    if chunk := over.get("genai", {}).get("search", {}).get("chunk_size"):  # the seed article's Phi-3.5 16K settings: 8192
        genai["search"]["chunk_size"] = chunk
        genai["model"]["decoder"]["session_options"]["provider_options"][0]["RyzenAI"]["hybrid_opt_max_seq_length"] = str(chunk)
    write_json(pkg / "genai_config.json", genai)
    return pkg



# -- real reference packages -------------------------------------------------

REFERENCE_DIR_ENV = "RAIPACK_TEST_REFERENCE_DIR"
TINY = Dims(layers=2, heads=4, kv_heads=2, head_size=64, vocab=512, intermediate=512, context_length=16384)
_REPO = Path(__file__).resolve().parents[1]
# what the reference packages are made of: a change to any of these files builds them again
_REFERENCE_INPUTS = ("tests/factory.py", "tests/shared_fixtures.py", "stages/fuse/**/*", "stages/export/**/*.py",
                     "pipeline/data/calib.txt", "pipeline/profiles/*.json", "pipeline/npu/**/*.py", "pipeline/core/**/*.py")


def reference_package(profile_id: str) -> Path:
    """The real package of reference profile `profile_id` (read-only: copy it before changing it).

    Every reference profile is fused by stages/fuse/reference.py from one tiny model (TINY: a random
    Llama written as a Quark uint4 export, exported by the OGA builder), with its manifest written as
    the build runner would. They are built once, in a subprocess holding a file lock, into the folder
    $RAIPACK_TEST_REFERENCE_DIR (tests/conftest.py sets it under the test run's temp folder, so
    pytest-xdist workers and the subprocesses tests start share it), else into a folder of the
    system's temp folder named by a digest of the files they are made of."""
    folder = _reference_build() / profile_id
    if not folder.is_dir():
        raise ValueError(f"{profile_id} is not a reference profile")
    return folder


@lru_cache(maxsize=1)
def model_package() -> Path:
    """An ONNX Runtime model package (pipeline/modelpackage) of the reference-4K package and the export it
    was fused from, assembled once per process beside the reference packages (read-only: copy it first)."""
    from raipack.modelpackage.assemble import assemble_model_package

    out = _reference_build().parent / f"model-package-{os.getpid()}" / "Model.ortpackage"
    return assemble_model_package([reference_package("reference-4K")], out, export=reference_export()[0], name="Model")


def reference_export() -> tuple[Path, Path]:
    """(OGA export, Quark export) the reference packages were fused from (read-only)."""
    base = _reference_build()
    return base / "oga", base / "quark"


def reference_build_seconds() -> float:
    """How long building the reference packages took."""
    return json.loads((_reference_build() / "build.json").read_text())["seconds"]


def reference_key() -> str:
    """A digest of the files the reference packages are made of."""
    h = hashlib.sha256(sys.version.encode())
    for pattern in _REFERENCE_INPUTS:
        for path in sorted(p for p in _REPO.glob(pattern) if p.is_file() and "__pycache__" not in p.parts):
            h.update(path.relative_to(_REPO).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _reference_build() -> Path:
    from tiers import refuse_in_quick_tier

    # also when another test of the run built them already: in `make check` nothing builds them first
    refuse_in_quick_tier("the reference packages (tests/factory.py)")
    base = Path(os.environ.get(REFERENCE_DIR_ENV) or Path(tempfile.gettempdir()) / f"raipack-test-reference-{os.getuid()}" / reference_key())
    if not base.is_dir():
        base.parent.mkdir(parents=True, exist_ok=True)
        # the child takes the lock and finishes even if this process is killed meanwhile
        proc = subprocess.run([sys.executable, "-c", "import sys, factory; factory._build_locked(sys.argv[1])", str(base)],
                              cwd=_REPO, env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(_REPO / "tests"), str(_REPO)])),
                              capture_output=True, text=True)
        if proc.returncode or not base.is_dir():
            raise RuntimeError(f"building the reference packages in {base} failed:\n{proc.stderr[-4000:]}")
    return base


def _build_locked(base: str) -> None:
    from helpers import build_once

    def build(work: Path) -> None:
        start = time.perf_counter()
        work.mkdir()
        build_reference_packages(work)
        write_json(work / "build.json", {"seconds": round(time.perf_counter() - start, 2)})

    build_once(Path(base), build)


def build_reference_packages(out: Path, d: Dims = TINY) -> None:
    """out/quark (a Quark export of a random model), out/oga (its OGA export) and out/<profile id>
    for every reference profile, fused by the reference backend; a fuse finding is an error here."""
    from raipack.npu.profile import all_profiles
    from raipack.stages.export.builder import export
    from raipack.stages.fuse.reference import fuse

    write_quark_export(out / "quark", d)
    export(out / "quark", out / "oga")
    for pid, profile in all_profiles().items():
        if profile.target != "reference":
            continue
        report = fuse(out / "oga", out / pid, profile, quark_dir=out / "quark")
        if report["findings"] or not report["npu_complete"]:
            raise RuntimeError(f"fusing the tiny model for {pid} reported {report['findings']}")
        write_hub_gitattributes(out / pid)
        write_manifest(out / pid, target_profile=profile.extends)


def write_quark_export(folder: Path, d: Dims, seed: int = 0) -> Path:
    """The folder Quark's export_safetensors(custom_mode="quark", weight_format="real_quantized",
    pack_method="reorder") writes for a random Llama of dimensions `d` with tied embeddings and
    lm_head excluded: uint4 per group, asymmetric; no Quark run (importing Quark alone takes a minute)."""
    from shared_fixtures import train_bpe_tokenizer

    folder.mkdir(parents=True)
    tok = train_bpe_tokenizer(folder, vocab_size=d.vocab)
    rng = np.random.default_rng(seed)
    H, q_out, kv_out = d.hidden, d.heads * d.head_size, d.kv_heads * d.head_size
    tensors = {"model.embed_tokens.weight": rng.normal(0, 0.5, (d.vocab, H)).astype(np.float32), "model.norm.weight": np.ones(H, np.float32)}
    linears = {"self_attn.q_proj": (H, q_out), "self_attn.k_proj": (H, kv_out), "self_attn.v_proj": (H, kv_out), "self_attn.o_proj": (q_out, H),
               "mlp.gate_proj": (H, d.intermediate), "mlp.up_proj": (H, d.intermediate), "mlp.down_proj": (d.intermediate, H)}
    for i in range(d.layers):
        prefix = f"model.layers.{i}."
        tensors[prefix + "input_layernorm.weight"] = np.ones(H, np.float32)
        tensors[prefix + "post_attention_layernorm.weight"] = np.ones(H, np.float32)
        for name, (k, n) in linears.items():
            groups = k // d.group_size
            tensors[prefix + name + ".weight"] = _pack_uint4_reorder(rng.integers(0, 16, (k, n)))
            tensors[prefix + name + ".weight_scale"] = rng.uniform(0.002, 0.01, (groups, n)).astype(np.float32)
            tensors[prefix + name + ".weight_zero_point"] = _pack_uint4_reorder(rng.integers(6, 10, (groups, n)))
    write_safetensors(folder / "model.safetensors", tensors)
    cfg = model_config(d, with_quant=True)
    cfg.update(tie_word_embeddings=True, hidden_act="silu", rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=False, mlp_bias=False,
               bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    write_json(folder / "config.json", cfg)
    write_json(folder / "generation_config.json", {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id})
    return folder


def _pack_uint4_reorder(values: np.ndarray) -> np.ndarray:
    """Quark's uint4 packing with pack_method "reorder": eight values of the last axis per int32,
    in the order 0, 2, 4, 6, 1, 3, 5, 7 from the lowest nibble up."""
    rows, cols = values.shape
    v = values.astype(np.uint32).reshape(rows, cols // 8, 8)[:, :, [0, 2, 4, 6, 1, 3, 5, 7]]
    return (v << (4 * np.arange(8, dtype=np.uint32))).sum(axis=-1, dtype=np.uint32).view(np.int32)
