"""Check a build's input model folder before any heavy work. Nothing in it is run."""

from __future__ import annotations

import json
from pathlib import Path

from .data import load_data
from .errors import UsageError

PICKLES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


def check_model_dir(path: Path, trust_remote_code: bool = False) -> Path:
    path = Path(path).expanduser()
    text = str(path)
    if not path.exists():
        if "/" in text and not text.startswith((".", "/", "~")) and text.count("/") == 1:
            raise UsageError(f"{text} is not a local folder; raipack never downloads models (it works offline)", "download the model yourself, then pass its folder: raipack build ./MODEL_DIR")
        raise UsageError(f"model folder {text} does not exist", "pass a local Hugging Face model folder (config.json + *.safetensors)")
    if not path.is_dir():
        raise UsageError(f"{text} is a file; expected a Hugging Face model folder", "pass the folder that holds config.json")
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise UsageError(f"{cfg_path} is missing; expected a Hugging Face model folder", "pass the folder that holds config.json and the *.safetensors weights")
    try:
        cfg = json.loads(cfg_path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{cfg_path} is not readable JSON: {exc}", "fix or replace config.json") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"{cfg_path} is not a JSON object", "fix or replace config.json")
    if not list(path.glob("*.safetensors")):
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLES)
        if pickles:
            raise UsageError(f"{path} has only pickle checkpoints ({', '.join(pickles)}); raipack loads safetensors only, because unpickling can run code", "convert the weights to safetensors with a tool you trust, then build again")
        raise UsageError(f"{path} has no *.safetensors weights", "pass a folder with the model's safetensors files")
    arch = (cfg.get("architectures") or [None])[0]
    supported = load_data("architectures.json")["supported"]
    if arch not in supported:
        raise UsageError(f"{cfg_path}: architectures is {cfg.get('architectures')!r}; raipack builds {', '.join(supported)}", "use a model of a supported architecture (see README, supported models)")
    if cfg.get("auto_map") and not trust_remote_code:
        raise UsageError(f"{cfg_path} has auto_map: the model needs its own Python code, which raipack does not run by default", "pass --trust-remote-code if you trust this folder's code")
    return path
