"""What one stage job asks of its executor: memory (bytes), CPUs, GPUs and the custom resources
`ryzenai_sdk` (the fuse stage's SDK backend) and `npu` (a smoke that requires the NPU).

The quantize stage's memory is its own estimate (stages/quantize/memory.py: estimate, from config.json and
the [quantize] options); every other number comes from pipeline/batch/data/resources.json.
"""

from __future__ import annotations

import json
from pathlib import Path

from raipack.batch.jobs import StageJob, default_resources
from raipack.builder import stages
from raipack.builder.config import parse_config
from raipack.data import load_data


def data() -> dict:
    return load_data("data/resources.json", "raipack.batch")


def estimate(job: StageJob) -> dict[str, int]:
    st = stages.get(job.stage)
    cfg = parse_config(st.config, job.recipe.stages.get(job.stage), f"[{job.stage}]")
    out = default_resources()
    config_json = _config_json(job)
    rule = data()["memory"].get(job.stage, {"base": 0})
    out["memory"] = int(rule["base"] + rule.get("per_weight_byte", 0) * _float32_bytes(config_json))
    if job.stage == "quantize":
        out.update(_quantize(cfg, config_json, out["memory"]))
    for stage, custom in data()["custom"].items():
        if stage == job.stage and getattr(cfg, custom["config"], None) == custom["value"]:
            out[custom["resource"]] = 1
    return out


def _quantize(cfg, config_json: dict | None, fallback: int) -> dict[str, int]:
    """The quantize estimate on the device it runs on: host memory on the CPU; on CUDA one GPU (the estimate is
    the GPU's), the host keeping the rule's allowance."""
    from raipack.stages.quantize.memory import estimate as quantize_estimate

    if getattr(cfg, "device", "cpu") == "cuda":
        return {"num_gpus": 1, "memory": fallback}
    try:
        est = quantize_estimate(config_json, dtype=cfg.dtype, device=cfg.device, num_samples=cfg.num_samples,
                                seq_len=cfg.seq_len, algorithm=cfg.algorithm)
    except (ValueError, TypeError, KeyError, AttributeError):  # no config.json yet, an architecture the memory model
        return {"memory": fallback}  # does not know, a stand-in stage's config: the allowance
    return {"memory": int(est.total)}


def _config_json(job: StageJob) -> dict | None:
    folders = [Path(p) for p in job.inputs.values()] + ([Path(job.recipe.model)] if job.recipe.model else [])
    for folder in folders:
        try:
            doc = json.loads((folder / "config.json").read_text("utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict):
            return doc
    return None


def _float32_bytes(config_json: dict | None) -> int:
    if config_json is None:
        return 0
    from raipack.stages.quantize.memory import Shape

    try:
        return 4 * Shape.from_config(config_json).params()
    except (ValueError, TypeError, KeyError):
        return 0
