"""Folders that are not onnxruntime-genai packages, said in one sentence.

AMD's Ryzen AI model collections also ship folders that onnxruntime-genai never loads: raw ONNX
graphs for onnxruntime and the VitisAI execution provider (`LFM2-1.2B-ONNX_rai_1.7.1`: `full.onnx`
and `full.pb.bin`) and embedding models without a genai_config.json
(`embeddinggemma-300m_npu_rai_1.8.0_npu_4K`, run with `onnxruntime.InferenceSession`: RyzenAI-SW
issue 387). Judging them as a broken onnxruntime-genai export says "copy the complete package
again" of a folder that is complete; this says what the folder is and what raipack checks of it."""

from __future__ import annotations

from raipack.core.package import Package

CAUSAL = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")
LLM_FILES = {"rai_config.json", "generation_config.json"}  # what AMD's LLM packages ship beside genai_config.json


def not_genai(pkg: Package) -> tuple[str, str] | None:
    """(what the folder is, the hint) when it holds ONNX graphs but nothing of an onnxruntime-genai
    package or of a raipack build stage; None otherwise."""
    roles = {f.role for f in pkg.files.values()}
    if "genai_config" in roles or "safetensors" in roles or "manifest.json" in pkg.files or "graph" not in roles:
        return None
    if "metastate" in roles or LLM_FILES & set(pkg.files) or {"cache", ".cache"} & pkg.dirs:
        return None  # an LLM package for AMD's runtime that lost its genai_config.json: RP107 says so
    graphs = sorted(f.rel for f in pkg.by_role("graph"))
    shown = ", ".join(graphs[:3]) + (", …" if len(graphs) > 3 else "")
    kind = "an embedding model" if _embedding(pkg) else "raw ONNX graphs"
    what = (f"holds {kind} ({shown}) and no genai_config.json: it is not an onnxruntime-genai package, which is what raipack checks; "
            "AMD ships such folders for onnxruntime with the VitisAI execution provider, and raipack checks nothing of them")
    hint = "load it with onnxruntime.InferenceSession as its model card says, or give --profile to check it against a profile anyway"
    return what, hint


def _embedding(pkg: Package) -> bool:
    cfg = pkg.try_json("config.json")
    archs = cfg.get("architectures") if isinstance(cfg, dict) else None
    if isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs):
        return not any(a.endswith(CAUSAL) for a in archs)
    return "embed" in pkg.name.lower()
