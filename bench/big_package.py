"""The bench's big package: a raipack package at Llama-3.1-8B's real dimensions (32 layers, hidden
4096, 32 heads, 8 KV heads, head 128, intermediate 14336, vocab 128256), built by the fuse stage's
own code for the reference-16K profile (every prefill and token tier of the 1.8.0 16K release), with
its manifest written as the build runner writes it.

The export it is fused from is `fuse_speed.synthetic_export(..., sparse=True)`: the builder's node
layout with the weights left as holes of `model.onnx.data`, so generating it costs neither disk nor
time. Fuse then writes `model.bin` and `model.onnx.data` densely (zeros; ~8 GB at these dimensions,
see docs/measurements/bench.md): `build()` returns the folder and fuse's report, and the caller
removes the folder when done.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests"))

from factory import LLAMA_8B, model_config, tokenizer_json, write_json  # noqa: E402

PROFILE = "reference-16K"
NAME = "Llama-3.1-8B-Instruct_rai_1.8.0_npu_16K"  # AMD's naming, as raipack build names its packages


def build(tmp: Path) -> tuple[Path, dict]:
    """Fuse a sparse 8B-dimension export into tmp/NAME and write its manifest; the export is
    removed afterwards. Returns (package folder, fuse report with `manifest_seconds` added)."""
    from fuse_speed import synthetic_export

    from raipack.core import manifest
    from raipack.npu.profile import get as get_profile
    from raipack.stages.fuse.reference import fuse

    export = synthetic_export(tmp / "export-8b", LLAMA_8B, sparse=True)
    write_json(export / "config.json", model_config(LLAMA_8B, with_quant=True))
    write_json(export / "tokenizer.json", tokenizer_json(LLAMA_8B.tokenizer_vocab or LLAMA_8B.vocab))
    write_json(export / "tokenizer_config.json", {"bos_token": "<s>", "eos_token": "</s>", "model_max_length": LLAMA_8B.context_length,
                                                  "tokenizer_class": "PreTrainedTokenizerFast"})
    write_json(export / "generation_config.json", {"bos_token_id": 1, "eos_token_id": [2, 3], "do_sample": True, "temperature": 0.6, "top_p": 0.9})
    profile = get_profile(PROFILE)
    pkg = tmp / NAME
    try:
        report = fuse(export, pkg, profile)
    finally:
        shutil.rmtree(export, ignore_errors=True)
    t = time.perf_counter()
    doc = manifest.describe(pkg, "package", extra={"target_profile": profile.extends})
    manifest.put(pkg, doc)
    report["manifest_seconds"] = round(time.perf_counter() - t, 2)
    return pkg, report


def disk_bytes(folder: Path) -> int:
    """Bytes the folder's files occupy on disk (holes not counted)."""
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="raipack-bench-8b-") as d:
        t0 = time.perf_counter()
        pkg, rep = build(Path(d))
        print(f"built {pkg.name} in {time.perf_counter() - t0:.1f} s (fuse {rep['seconds']} s, manifest {rep['manifest_seconds']} s), "
              f"{rep['bytes_written'] / 1e9:.2f} GB written, {disk_bytes(pkg) / 1e9:.2f} GB on disk, {len(rep['findings'])} findings")
