"""Run the onnxruntime-genai model builder on a Quark export, keeping Quark's decisions.

The builder (0.18) reads a Quark export directly (`quant_method: quark`) and repacks its uint4 weights
into `MatMulNBits` with Quark's group size and zero points. What it does on its own: it quantizes any
MatMul that Quark left in float (int4, symmetric, block 32) and, for a tied lm_head, shares that
quantized weight with the embedding through `GatherBlockQuantized`. `export` therefore passes every
layer Quark excluded to the builder's `nodes_to_exclude` option (and the embedding `Gather` when the
model ties it to lm_head), unless `keep_excluded_float=False`.

The builder re-saves the tokenizer through AutoTokenizer (its own model_max_length; for Qwen2 a default
<|endoftext|> the model may have no row for). The source's tokenizer files are put back byte for byte
afterwards (`carry_tokenizer`, as AMD's packages carry them), and genai_config.json's own token ids are
kept inside the vocabulary there (`fit_token_ids`), never by editing the tokenizer.

The builder is called through `parse_extra_options` + `create_model`, never through its CLI
(`--help` crashes in 0.18). Output goes into `out_dir` (new or empty: raipack.core.output.output_folder),
the builder's scratch cache inside it until it returns; the build runner stages and swaps the folder.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
from pathlib import Path

from raipack.core.errors import RaipackError
from raipack.core.output import output_folder
from raipack.core.package import role_of
from raipack.stages.export.contract import hf_to_node, is_excluded, layer_weight_spec
from raipack.stages.export.families import extra_options as family_options
from raipack.stages.export.families import patched_builder
from raipack.stages.export.nbits import skip_idle_nbits_pass

# Settings per target, from AMD's published recipes: the NPU flow exports int4 for the CPU EP with
# float32 activations (Quark run with float32); hybrid packages were built with `-p int4 -e dml`
# from a float16 Quark export (the builder then uses float16 I/O).
PROFILES: dict[str, dict[str, str]] = {
    "npu": {"precision": "int4", "execution_provider": "cpu"},
    "hybrid": {"precision": "int4", "execution_provider": "dml"},
}

# Files of the Quark folder a consumer needs that the builder does not write itself.
COPY_FILES = ("generation_config.json",)

# The tokenizer is the source's, byte for byte, as in AMD's packages: the builder re-saves it through
# AutoTokenizer, which rewrites model_max_length and, for Qwen2 without <|endoftext|>, adds a token
# beyond the model's vocabulary. Which files are the tokenizer's: their roles in pipeline/data/roles.json.
TOKENIZER_ROLES = ("tokenizer", "chat_template")
TEMPLATES_DIR = "additional_chat_templates"  # transformers' folder of named chat templates
RUNTIME_TOKENIZER = "tokenizer.json"  # what the runtimes read: the builder's conversion stays when the source has none

EMBED_GATHER = "/model/embed_tokens/Gather"

# On the CPU EP the builder defaults MatMulNBits to accuracy_level 4, which quantizes activations to
# int8 inside every MatMulNBits. Quark's `uint4_wo_*` schemes are weight-only (float activations), and
# the NPU computes in bf16, so the export keeps float32 activations unless the caller passes its own
# accuracy_level. Measured on SmolLM2-135M: level 1 matches the Quark model to cosine 1.0 and
# identical greedy tokens; level 4 gives cosine 0.997 and diverging greedy tokens, but decodes
# ~1.4x faster on CPU (docs/measurements/export.md).
CPU_FAITHFUL_OPTIONS = {"accuracy_level": "1"}
BUILDER_CACHE = ".builder-cache"  # the builder's scratch folder, inside the output until it returns


HINT = 'check the Quark export and the [export] options'


def read_quark_config(quark_dir: Path) -> tuple[dict, dict]:
    """(config.json, its quantization_config) of a Quark export; raises RaipackError if not one."""
    path = Path(quark_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RaipackError(f"{path}: not found; the export stage reads a Quark export folder",
                          "run the quantize stage first, or point at the folder it wrote") from None
    except json.JSONDecodeError as err:
        raise RaipackError(f"{path}: not valid JSON ({err})", "re-run the quantize stage") from None
    qc = config.get("quantization_config") or {}
    if qc.get("quant_method") != "quark":
        raise RaipackError(
            f"{path}: quantization_config.quant_method is {qc.get('quant_method')!r}, expected 'quark'",
            "export the Quark model with export_safetensors(custom_mode='quark')",
        )
    weight = (qc.get("global_quant_config") or {}).get("weight") or {}
    if not weight.get("group_size"):
        raise RaipackError(
            f"{path}: quantization_config.global_quant_config.weight has no group_size",
            "quantize with a per-group scheme such as uint4_wo_128",
        )
    return config, qc


def safetensors_names(folder: Path) -> list[str]:
    """Tensor names of every *.safetensors file in `folder`, read from the headers only."""
    names: list[str] = []
    for path in sorted(Path(folder).glob("*.safetensors")):
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        names.extend(k for k in header if k != "__metadata__")
    return names


def excluded_nodes(quark_dir: Path, config: dict, quant_config: dict) -> list[str]:
    """Builder node names of the layers Quark left in float (plus the embedding Gather if tied)."""
    modules = {n.rsplit(".", 1)[0] for n in safetensors_names(quark_dir) if n.endswith(".weight")}
    tied = bool(config.get("tie_word_embeddings", False))
    if tied or "lm_head.weight" not in modules:
        modules.add("lm_head")
    nodes = []
    for name in sorted(modules):
        node = hf_to_node(name)
        if node and is_excluded(quant_config, name):
            nodes.append(node)
    if tied:  # Quark never quantizes token embeddings; keep the builder from sharing a quantized lm_head
        nodes.append(EMBED_GATHER)
    return nodes


def _tokenizer_entries(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()
            if p.is_file() and role_of(p.name) in TOKENIZER_ROLES or p.is_dir() and p.name == TEMPLATES_DIR}


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def _same(a: Path, b: Path) -> bool:
    if a.is_dir() or b.is_dir():
        return False
    return a.stat().st_size == b.stat().st_size and a.read_bytes() == b.read_bytes()


def carry_tokenizer(source: Path, out: Path) -> dict:
    """Put the source's tokenizer and chat template files back into `out` unchanged, and remove the
    ones the builder wrote that the source does not have (keeping its tokenizer.json when the source
    has none). Returns what was done, for the stage report."""
    src_names, built = _tokenizer_entries(source), _tokenizer_entries(out)
    rewritten = sorted(n for n in src_names & built if not _same(source / n, out / n))
    for name in sorted(src_names):
        _remove(out / name)
        if (source / name).is_dir():
            shutil.copytree(source / name, out / name)
        else:
            shutil.copy2(source / name, out / name)
    keep = set() if RUNTIME_TOKENIZER in src_names else {RUNTIME_TOKENIZER}
    removed = sorted(built - src_names - keep)
    for name in removed:
        _remove(out / name)
    return {"from_source": sorted(src_names), "rewritten_by_builder": rewritten, "removed": removed,
            "converted_by_builder": sorted((built - src_names) & keep)}


def fit_token_ids(out: Path) -> dict:
    """genai_config.json's own token ids inside the model's vocabulary. The builder takes a missing pad
    (or end-of-turn) id from the tokenizer it loaded, which may hold a token the model has no row for
    (Qwen2Tokenizer adds <|endoftext|>); such an id is dropped from eos_token_id, and pad_token_id
    becomes the first end-of-sequence id, as the builder does when there is no pad token. The
    tokenizer files are never edited for this. Returns {field: [old, new]} of what changed."""
    path = out / "genai_config.json"
    genai = json.loads(path.read_text(encoding="utf-8"))
    model = genai.get("model") or {}
    vocab = model.get("vocab_size")
    if not isinstance(vocab, int):
        return {}
    changed = {}
    eos = model.get("eos_token_id")
    if isinstance(eos, list) and any(i >= vocab for i in eos) and any(i < vocab for i in eos):
        changed["eos_token_id"] = [eos, [i for i in eos if i < vocab]]
        model["eos_token_id"] = changed["eos_token_id"][1]
    first_eos = (model["eos_token_id"][0] if isinstance(model.get("eos_token_id"), list) else model.get("eos_token_id"))
    if isinstance(model.get("pad_token_id"), int) and model["pad_token_id"] >= vocab and isinstance(first_eos, int) and first_eos < vocab:
        changed["pad_token_id"] = [model["pad_token_id"], first_eos]
        model["pad_token_id"] = first_eos
    if changed:
        path.write_text(json.dumps(genai, indent=4, ensure_ascii=False) + "\n", encoding="utf-8")  # no \\uXXXX (RP204)
    return changed


def _files(folder: Path) -> list[dict]:
    out = []
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            out.append({"path": p.relative_to(folder).as_posix(), "size": p.stat().st_size})
    return out


def export(
    quark_dir: Path,
    out_dir: Path,
    *,
    precision: str = "int4",
    execution_provider: str = "cpu",
    keep_excluded_float: bool = True,
    extra_options: dict | None = None,
) -> dict:
    """Export `quark_dir` (a Quark safetensors export) to an OGA model folder at `out_dir`.

    `extra_options` are builder extra options (values str/int/bool; see the builder's source for the
    names); an explicit `nodes_to_exclude` there replaces the derived one, an explicit
    `accuracy_level` the float32 default used for the CPU EP (CPU_FAITHFUL_OPTIONS). `out_dir` must be new or
    empty; on failure it is left as it was. Returns a dict for the stage report.
    """
    t_start = time.perf_counter()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    quark_dir, out_dir = Path(quark_dir).resolve(), Path(out_dir).resolve()
    config, qc = read_quark_config(quark_dir)
    weight = layer_weight_spec(qc, "")  # global spec

    options: dict[str, str] = {}
    derived = excluded_nodes(quark_dir, config, qc) if keep_excluded_float else []
    if derived:
        options["nodes_to_exclude"] = ",".join(derived)
    if execution_provider == "cpu":
        options.update(CPU_FAITHFUL_OPTIONS)
    options.update(family_options(config.get("model_type")))
    for key, value in (extra_options or {}).items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        options[str(key)] = str(value)

    import onnxruntime_genai
    from onnxruntime_genai.models.builder import create_model, parse_extra_options

    with output_folder(out_dir) as out:
        cache = out / BUILDER_CACHE  # the builder's download/cache folder: inside the output, removed after
        try:
            t_builder = time.perf_counter()
            kv = [f"{k}={v}" for k, v in options.items()]
            parsed = parse_extra_options(
                None, str(quark_dir), str(out), precision, execution_provider, str(cache), kv
            )
            with patched_builder(), skip_idle_nbits_pass() as skipped:
                create_model(None, str(quark_dir), str(out), precision, execution_provider, str(cache), **parsed)
            builder_seconds = time.perf_counter() - t_builder

            tokenizer = carry_tokenizer(quark_dir, out)
            tokenizer["genai_config_ids"] = fit_token_ids(out)
            copied = []
            for name in COPY_FILES:
                src = quark_dir / name
                if src.is_file() and not (out / name).exists():
                    shutil.copy2(src, out / name)
                    copied.append(name)
        finally:
            shutil.rmtree(cache, ignore_errors=True)

    return {
        "seconds": round(time.perf_counter() - t_start, 3),
        "builder_seconds": round(builder_seconds, 3),
        "builder": "onnxruntime_genai.models.builder",
        "builder_version": getattr(onnxruntime_genai, "__version__", "unknown"),
        # the builder's int4 pass over the whole model: skipped when it had nothing to quantize (stages/export/nbits.py)
        "builder_nbits_pass": "skipped" if skipped and all(skipped) else "ran",
        "precision": precision,
        "execution_provider": execution_provider,
        "extra_options": options,
        "nodes_to_exclude": options.get("nodes_to_exclude", "").split(",") if options.get("nodes_to_exclude") else [],
        "quark": {
            "group_size": weight["group_size"] if weight else None,
            "bits": weight["bits"] if weight else None,
            "symmetric": weight["symmetric"] if weight else None,
            "exclude": list(qc.get("exclude") or []),
        },
        "copied": copied,
        "tokenizer": tokenizer,
        "files": _files(out_dir),
    }
