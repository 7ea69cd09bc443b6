"""The reference fuse backend's configuration files and card: genai_config.json (the settings'
provider options and search), rai_config.json, config.json, the tokenizer and license files,
prompts.txt and README.md."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from raipack.npu.loader_choice import fit, for_release
from raipack.npu.spec import Profile
from raipack.runtime.prompts import defaults, write_prompts_file
from raipack.stages.fuse.fuse_run import FuseRun, write_json

CONFIG_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
                "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json", "generation_config.json",
                "LICENSE", "LICENSE.txt", "LICENSE.md", "USE_POLICY.md", "NOTICE")
SAMPLING_KEYS = ("do_sample", "temperature", "top_p", "top_k", "repetition_penalty")


def write_configs(run: FuseRun, stage: Path) -> None:
    """genai_config.json (the settings' provider options and search), rai_config.json, config.json,
    the tokenizer and license files, the card."""
    copied = []
    for name in CONFIG_FILES:
        for d in (run.export_dir, run.quark_dir):
            if d and (d / name).is_file():
                shutil.copy2(d / name, stage / name)
                copied.append(name)
                break
    gen_cfg = {}
    if (stage / "generation_config.json").is_file():
        gen_cfg = json.loads((stage / "generation_config.json").read_text("utf-8"))
    L = run.L
    new_genai = _genai_config(run.genai, run.settings.provider_options(run.profile), L, gen_cfg, run.names["graph"])
    loader = for_release(run.profile)
    if loader is not None:  # the release's loader refuses keys a newer model builder writes (RP204)
        new_genai, removed = fit(new_genai, loader)
        run.dropped_keys = removed
    run.written["genai_config.json"] = write_json(stage / "genai_config.json", new_genai)
    run.written["rai_config.json"] = write_json(stage / "rai_config.json", {"max_prompt_length": L["max_prompt_length"]})
    run.written["config.json"] = write_json(stage / "config.json", run.model_config)
    prompts = write_prompts_file(stage, [n for n in defaults()["lengths"] if n <= (run.settings.prompt_limit(run.profile, run.profile.release) or (0,))[0]])
    if prompts:  # what raipack bench runs, as AMD's packages ship it; written now, since a sealed package is never edited
        run.written["prompts.txt"] = prompts
    card = _readme(run.model_config, run.profile, L, run)
    (stage / "README.md").write_text(card, "utf-8")
    run.written["README.md"] = len(card.encode())
    for name in copied:
        run.written.setdefault(name, (stage / name).stat().st_size)


def fused_counts(fused) -> dict:
    out: dict[str, int] = {}
    for f in fused:
        out[f.op_type] = out.get(f.op_type, 0) + 1
    return out


def _genai_config(genai: dict, opts: dict, L: dict, gen_cfg: dict, graph: str) -> dict:
    doc = json.loads(json.dumps(genai))
    dec = doc["model"]["decoder"]
    session = dict(dec.get("session_options") or {})
    session.setdefault("log_id", "onnxruntime-genai")
    session["provider_options"] = [{"RyzenAI": opts}]
    dec["session_options"] = session
    dec["filename"] = graph
    search = doc.setdefault("search", {})
    search["max_length"] = L["max_length"]
    if L["chunk_size"]:
        search["chunk_size"] = L["chunk_size"]
    else:
        search.pop("chunk_size", None)
    search["past_present_share_buffer"] = True
    search["num_beams"] = 1
    for key in SAMPLING_KEYS:
        if key in gen_cfg and gen_cfg[key] is not None:
            search[key] = gen_cfg[key]
    return doc


def _readme(model_config: dict, profile: Profile, L: dict, run: FuseRun) -> str:
    fg, written, findings, names = run.fg, run.written, run.findings, run.names
    name = model_config.get("_name_or_path") or (model_config.get("architectures") or ["model"])[0]
    name = str(name).rstrip("/").rsplit("/", 1)[-1] or "model"
    w = (model_config.get("quantization_config") or {}).get("global_quant_config", {}).get("weight", {})
    counts = fused_counts(fg.fused)
    lines = [
        f"# {name} — raipack reference package ({profile.id})", "",
        f"This folder follows the file layout of AMD's Ryzen AI {profile.release} {_kind(L)} packages (`{names['graph']}`, `{names['data']}`, "
        f"`{names['weights']}`, `{names['header']}`, `cache/`{', `dd_metastate_*`' if L['prefill'] else ''}, `genai_config.json`, `rai_config.json`).", "",
        f"**The binary files (`{names['weights']}`, `{names['header']}`, `cache/*.const`{', `dd_metastate_*`' if L['prefill'] else ''}) are in raipack's own documented "
        "open format (docs/formats.md in the raipack repository). They are NOT loadable by AMD's proprietary Ryzen AI runtime "
        "or by `model_generate` output consumers; only raipack's reference runtime executes this package (on the CPU, the way "
        "the NPU runtime would: static KV buffer, prompts padded to a tier, one token at a time).**", "",
        "## Contents", "",
        f"- Quantization: {w.get('dtype', 'uint4')}, group size {w.get('group_size', '?')}, "
        f"{'symmetric' if w.get('symmetric') else 'asymmetric'} (Quark; `config.json` keeps its `quantization_config`).",
        "- Fused operators (domain `ai.raipack`, each an ONNX local function): " + ", ".join(f"{k} ×{v}" for k, v in sorted(counts.items())) + ".",
        _lengths_line(L),
        "- Longest prompt per Ryzen AI version (`rai_config.json`): " + ", ".join(f"{v}: {n}" for v, n in sorted(L["max_prompt_length"].items())) + ".",
        f"- `{names['weights']}` {written.get(names['weights'], 0)} bytes (NPU side), `{names['data']}` {written.get(names['data'], 0)} bytes (CPU side).",
    ]
    left = [n for n in fg.cpu_nodes if n["why"] == "not fused"]
    if left or findings:
        lines += ["", "## Not on the NPU", ""]
        lines += [f"- {f.severity}: {f.message}" for f in findings]
    lines += ["", "## Run it", "", "```sh", "raipack run <this folder> --prompt \"What is the capital of France?\"", "```", "",
              "`raipack validate <this folder>` checks it first; `raipack run --help` lists the options.", ""]
    return "\n".join(lines)


def _kind(L: dict) -> str:
    return "NPU" if L["prefill"] else "hybrid (NPU prefill, iGPU decode)"


def _lengths_line(L: dict) -> str:
    if not L["prefill"]:
        return (f"- Maximum length {L['max_length']} tokens (one KV buffer, decoded on the iGPU); one NPU prefill pass "
                f"takes up to {L['npu_seq']} tokens (`hybrid_opt_max_seq_length`); no tiers, no `dd_metastate_*`.")
    return (f"- Maximum length {L['max_length']} tokens; prefill tiers {L['prefill']}; token tiers {L['token']}; "
            f"chunked prefill {'on (chunk ' + str(L['chunk_size'] or L['npu_seq']) + ')' if L['chunked'] else 'off'}.")
