"""The files a package's loaders open, as its own genai_config.json names them.

onnxruntime-genai opens every graph a model section names, relative to the config's folder
(`config_path / filename`): the decoder (src/models/decoder_only.cpp), each stage of a decoder
pipeline (decoder_only_pipeline.cpp), the vision, speech and embedding graphs of a multimodal model
(multi_modal.cpp), the image and audio processors' `config_filename` (gemma_image_processor.cpp,
phi_image_processor.cpp, qwen2_5_vl_image_processor.cpp, whisper_processor.cpp, ...), at v0.14.0.
AMD's runtime opens the RyzenAI options that name files or folders (`external_data_file`,
`dd_cache`, `dd_root`: pipeline/data/ryzenai_options.json, `path_options`)."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from raipack.data import load_data
from raipack.npu.genai import ryzenai_options, table

KINDS = {"filename": "graph", "config_filename": "processor config", "adapter_filename": "adapter"}
EVIDENCE = {
    "graph": "onnxruntime-genai creates a session of it when the model loads (src/models/multi_modal.cpp, decoder_only_pipeline.cpp at v0.14.0)",
    "processor config": "onnxruntime-genai's image or audio processor reads it (src/models/*_image_processor.cpp at v0.14.0)",
    "adapter": "onnxruntime-genai reads it with its model section (src/config.cpp at v0.14.0: adapter_filename)",
    "folder": "AMD's runtime reads its dynamic-dispatch files there (the DynamicDispatch keys of AMD's onnx_utils sources; AMD_PACKAGES.md §2)",
    "file": "AMD's runtime reads it (pipeline/data/ryzenai_options.json)",
}


@dataclass(frozen=True)
class Opened:
    rel: str  # as the config names it, with / separators
    pointer: str  # where genai_config.json names it
    kind: str  # graph, processor config, adapter, folder, file

    @property
    def evidence(self) -> str:
        return EVIDENCE[self.kind]


def opened(genai) -> list[Opened]:
    """Every file or folder genai_config.json names for a loader to open, in document order."""
    out: list[Opened] = []
    for section, body in table(genai, "model").items():
        if not isinstance(body, dict):
            continue
        base = f"/model/{section}"
        for key, kind in KINDS.items():
            if isinstance(body.get(key), str) and body[key]:
                out.append(Opened(_rel(body[key]), f"{base}/{key}", kind))
        out += _stages(body.get("pipeline"), f"{base}/pipeline")
    opts, where = ryzenai_options(genai)
    for key, kind in load_data("ryzenai_options.json").get("path_options", {}).items():
        value = opts.get(key)
        if not key.startswith("$") and isinstance(value, str) and value:
            out.append(Opened(_rel(value), where[key], kind))
    return out


def _stages(pipeline, base: str) -> list[Opened]:
    """A pipeline's stages: an array of {"name": {...}} (the builder's form) or one object of them."""
    blocks = [(f"{base}/{i}", b) for i, b in enumerate(pipeline)] if isinstance(pipeline, list) else [(base, pipeline)]
    out = []
    for pointer, block in blocks:
        for name, stage in table({"b": block}, "b").items():
            if isinstance(stage, dict) and isinstance(stage.get("filename"), str) and stage["filename"]:
                out.append(Opened(_rel(stage["filename"]), f"{pointer}/{name}/filename", "graph"))
    return out


def _rel(value: str) -> str:
    return posixpath.normpath(value.replace("\\", "/")) if not value.startswith(("/", "\\")) and ":" not in value[:3] else value


def nearest_folder(missing: str, folders: set[str]) -> str | None:
    """The package folder a wrong folder option most likely means: the one sharing the longest tail
    of path components with it (`x/partitioned/cache` -> `partitioned/cache`)."""
    parts = missing.strip("/").split("/")
    for n in range(len(parts) - 1, 0, -1):
        tail = "/".join(parts[-n:])
        hits = sorted(f for f in folders if f == tail or f.endswith("/" + tail))
        if hits:
            return hits[0]
    return None


def cache_dir(genai, dirs: set[str]) -> str | None:
    """The folder the runtime reads its per-node files from: the one `dd_cache` names when the
    package has it, else `cache/` or `.cache/`, else the folder a wrong `dd_cache` must mean (RP109
    reports the option; the other checks then read the files where they are)."""
    named = next((o.rel for o in opened(genai) if o.pointer.endswith("/dd_cache") and o.kind == "folder"), None)
    if named in dirs:
        return named
    found = next((d for d in ("cache", ".cache") if d in dirs), None)
    if found or named is None:
        return found
    return nearest_folder(named, dirs)
