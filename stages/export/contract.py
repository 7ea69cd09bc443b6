"""Folder-level output checks of the export stage (the graph checks live in
pipeline/checks/onnx_contract.py, shared with `raipack validate`)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from pipeline.npu.contract import (  # noqa: F401  (re-exported for the stage and its tests)
    _f,
    external_data_refs,
    hf_to_node,
    io_contract,
    is_excluded,
    layer_weight_spec,
    matmulnbits_agreement,
    node_to_hf,
)


def check_export(out_dir: str | Path, quant_config: dict | None = None) -> list[dict]:
    """All output checks of the export stage on a folder: genai_config.json, graph load without
    external data, I/O contract, external data, MatMulNBits agreement (if `quant_config`),
    tokenizer and chat template."""
    folder = Path(out_dir)
    cfg_path = folder / "genai_config.json"
    try:
        genai = json.loads(cfg_path.read_text(encoding="utf-8"))
        filename = genai["model"]["decoder"]["filename"]
    except FileNotFoundError:
        return [_f("export.genai_config", "genai_config.json", "genai_config.json is missing", "re-run the export")]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        return [_f("export.genai_config", "genai_config.json",
                   f"genai_config.json does not parse or lacks model.decoder.filename ({err})", "re-run the export")]
    out: list[dict] = []
    try:
        model = onnx.load(str(folder / filename), load_external_data=False)
    except Exception as err:  # noqa: BLE001 - any load failure is the finding
        out.append(_f("export.graph", filename, f"'{filename}' does not load with onnx ({type(err).__name__}: {err})",
                      "re-export; a ~130-byte file is a Git LFS pointer, fetch the real file"))
        model = None
    if model is not None:
        out += io_contract(model, genai)
        out += external_data_refs(model, folder)
        if quant_config:
            out += matmulnbits_agreement(model, quant_config)
    out += tokenizer_files(folder)
    return out


def tokenizer_files(folder: str | Path) -> list[dict]:
    """tokenizer.json loads (with onnxruntime-genai's tokenizer when installed) and a chat template
    exists (chat_template.jinja or tokenizer_config.json) and parses (with jinja2 when installed)."""
    folder = Path(folder)
    out: list[dict] = []
    tok = folder / "tokenizer.json"
    if not tok.is_file() and not (folder / "tokenizer.model").is_file():
        out.append(_f("export.tokenizer", "tokenizer.json", "no tokenizer.json (or tokenizer.model) in the export folder",
                      "copy the tokenizer files from the Quark folder"))
    else:
        try:
            import onnxruntime_genai as og
        except ImportError:
            og = None
        try:
            if og is not None:
                og.Tokenizer(str(folder)).encode("Hello")
            elif tok.is_file():
                json.loads(tok.read_text(encoding="utf-8"))["model"]
        except Exception as err:  # noqa: BLE001
            out.append(_f("export.tokenizer", "tokenizer.json",
                          f"the tokenizer does not load ({type(err).__name__}: {str(err)[:200]})",
                          "OGA rejects some tokenizer types (e.g. WordLevel); export a BPE/Unigram tokenizer.json"))
    template = None
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    else:
        try:
            template = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template")
        except (OSError, json.JSONDecodeError):
            template = None
    if not template:
        out.append(_f("export.chat_template", "chat_template.jinja",
                      "no chat template (chat_template.jinja or tokenizer_config.json chat_template)",
                      "copy chat_template.jinja from the source model"))
    elif isinstance(template, str):
        try:
            import jinja2
        except ImportError:
            jinja2 = None
        if jinja2 is not None:
            try:
                jinja2.Environment().parse(template)
            except jinja2.TemplateSyntaxError as err:
                out.append(_f("export.chat_template", "chat_template.jinja",
                              f"the chat template does not parse (line {err.lineno}: {err.message})",
                              "fix the template or copy the source model's"))
    return out
