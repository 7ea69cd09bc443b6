"""What one stage job asks of its executor: memory (bytes), CPUs, GPUs and the custom resources
`ryzenai_sdk` (the fuse stage's SDK backend) and `npu` (a smoke that requires the NPU).

Memory is the stage's estimate through the stage registry (pipeline/builder/stages.py: memory: the
stage's own, from config.json and its options, else the registry's allowance); a stage estimated on
CUDA asks for one GPU instead, the host keeping the registry's allowance. The custom resources come
from pipeline/batch/data/resources.json.
"""

from __future__ import annotations

from pathlib import Path

from raipack.batch.jobs import StageJob, default_resources
from raipack.builder import stages
from raipack.builder.config import parse_config
from raipack.data import load_data
from raipack.npu import profile as profiles


def data() -> dict:
    return load_data("data/resources.json", "raipack.batch")


def estimate(job: StageJob) -> dict[str, int]:
    st = stages.get(job.stage)
    cfg = parse_config(st.config, job.recipe.stages.get(job.stage), f"[{job.stage}]")
    out = default_resources()
    folders = [Path(p) for p in job.inputs.values()] + ([Path(job.recipe.model)] if job.recipe.model else [])
    profile = profiles.get(job.recipe.profile)
    est = stages.memory(job.stage, cfg, folders, profile)
    if est.device == "cuda":
        out.update({"num_gpus": 1, "memory": stages.allowance(job.stage, stages.model_config_of(folders), profile).bytes})
    else:
        out["memory"] = est.bytes
    for stage, custom in data()["custom"].items():
        if stage == job.stage and getattr(cfg, custom["config"], None) == custom["value"]:
            out[custom["resource"]] = 1
    return out
