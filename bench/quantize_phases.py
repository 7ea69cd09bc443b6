"""The quantize stage's memory by phase (issue 41): which step of Quark's AWQ, raipack's probes or the export
holds the peak. Not part of `make test`'s measurements (its test runs `--tiny` once).

A random-weight model at the real dimensions of `bench/real_models.json` (`--layers` of them, the published
vocabulary) goes through `quark_awq.quantize` with the stage's source probe and quantized probe, in this
process. A thread samples `/proc/self/status` every 10 ms and keeps the peak VmRSS, RssAnon and RssFile of
each phase; Quark's AWQ steps are named by wrapping its methods (`init_quant`, `_get_input_feat`,
`_search_best_scale`, `_search_best_clip`, `_apply_quant`). After each decoder layer the resident memory
is recorded too.

Quark's own switches are read when it is imported, and this script imports it before the stage's
`apply_runtime_settings` would set `OMP_WAIT_POLICY=PASSIVE` (and `QUARK_DISABLE_COMPILE=1` where torch finds
no C++ compiler): set them in the environment of this command to run as `raipack build` does (the table says
what Quark and OpenMP saw):

    OMP_WAIT_POLICY=PASSIVE python bench/quantize_phases.py --model llama-3.1-8b --layers 2
    QUARK_DISABLE_COMPILE=1 python bench/quantize_phases.py --model llama-3.1-8b --layers 2 --keep /tmp/phases
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import real_size  # noqa: E402  (bench/, on the path just above)

FIELDS = ("VmRSS", "RssAnon", "RssFile")
AWQ_STEPS = {"init_quant": "init_quant", "_get_input_feat": "input_feat", "_search_best_scale": "scale_search",
             "_search_best_clip": "clip_search", "_apply_quant": "apply_quant"}
GIB = 2**30


def status() -> dict[str, int]:
    """This process's resident memory now, bytes (Linux)."""
    return {**dict.fromkeys(FIELDS, 0), **real_size.proc_status("self", FIELDS)}


class Phases:
    """The current phase's name and each phase's peak, sampled by a daemon thread."""

    def __init__(self, every_s: float = 0.01):
        self.name, self.peaks, self.every_s, self._stop = "load", {}, every_s, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.note()
            time.sleep(self.every_s)

    def note(self) -> None:
        now, peak = status(), self.peaks.setdefault(self.name, dict.fromkeys(FIELDS, 0))
        for key in FIELDS:
            peak[key] = max(peak[key], now[key])

    def start(self) -> Phases:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def wrap(self, owner: object, attribute: str, name: str) -> None:
        """Calls of ``owner.attribute`` count as phase ``name`` (the phase before comes back after it)."""
        original = getattr(owner, attribute)

        def wrapper(*args, **kwargs):
            before, self.name = self.name, name
            try:
                return original(*args, **kwargs)
            finally:
                self.note()
                self.name = before

        setattr(owner, attribute, wrapper)


def run(src: Path, work: Path, samples: int, seq_len: int) -> dict:
    from quark.torch.algorithm.awq.awq import AwqProcessor
    from quark.torch.utils import QUARK_DISABLE_COMPILE

    # as torch and Quark read them at their import, just above (quantize() sets the stage's defaults only after it)
    env = {"QUARK_DISABLE_COMPILE": "1" if QUARK_DISABLE_COMPILE else "0", "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "unset")}

    from raipack.data import heldout_text
    from raipack.runtime.budget import probe_budget
    from raipack.stages.quantize import quark_awq
    from raipack.stages.quantize import stage as quantize_stage
    from raipack.stages.quantize.preflight import read_config

    budget = probe_budget(read_config(src))  # the stage's "auto" budget for this model, as its probes get it
    phases = Phases().start()
    for attribute, name in AWQ_STEPS.items():
        phases.wrap(AwqProcessor, attribute, name)
    layers: list[dict] = []
    t0 = time.perf_counter()

    def progress(step: str, done: int, total: int) -> None:
        if step == "awq":
            layers.append({"layer": done, "seconds": round(time.perf_counter() - t0, 1), **status()})

    def before(model):
        phases.name = "source_probe"
        try:
            return quantize_stage.probe_source(model, src, heldout_text(), tokens=budget.tokens, answer_tokens=budget.answer_tokens)
        finally:
            phases.name = "quark"

    record = quark_awq.quantize(src, work / "quark", algorithm="awq", num_samples=samples, seq_len=seq_len, progress=progress, before=before)
    phases.name = "quantized_probe"
    quantize_stage.measure(src, work / "quark", heldout_text(), dtype=record["dtype"], tokens=(budget.tokens, budget.answer_tokens), source_probe=record.pop("source_probe"))
    phases.stop()
    return {"seconds": round(time.perf_counter() - t0, 1), "seconds_quark": record["seconds_quantize"] + record["seconds_export"],
            "peak_rss_bytes": record["peak_rss_bytes"], "phases": phases.peaks, "layers": layers,
            "env": env}


def table(result: dict) -> str:
    lines = [f"{result['seconds']} s in all, Quark {result['seconds_quark']:.1f} s; quantize()'s peak {result['peak_rss_bytes'] / GIB:.2f} GiB; "
             f"at Quark's import {result['env']}", "", "| phase | VmRSS | RssAnon | RssFile |", "|---|---|---|---|"]
    lines += [f"| {name} | " + " | ".join(f"{peak[k] / GIB:.2f} GiB" for k in FIELDS) + " |" for name, peak in result["phases"].items()]
    if result["layers"]:
        first, last = result["layers"][0], result["layers"][-1]
        lines += ["", f"after decoder layer {first['layer']}: RssAnon {first['RssAnon'] / GIB:.2f} GiB; after layer {last['layer']}: "
                      f"{last['RssAnon'] / GIB:.2f} GiB ({last['seconds']} s)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(real_size.MODELS), default="llama-3.2-1b")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's)")
    parser.add_argument("--tiny", action="store_true", help="2 small layers (a check of the script)")
    parser.add_argument("--calibration", default=f"{real_size.AWQ_SAMPLES}x{real_size.AWQ_SEQ_LEN}", help="SAMPLESxTOKENS (default: the bench's 1x16)")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it (the model is reused when it is there)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    samples, seq_len = (int(x) for x in args.calibration.lower().split("x"))
    cfg = {k: v for k, v in real_size.MODELS[args.model].items() if not k.startswith("_")}
    if args.tiny:
        cfg = {**cfg, **real_size.TINY, "vocab_size": 49152}
    if args.layers:
        cfg["num_hidden_layers"] = args.layers
    work = args.keep or Path(tempfile.mkdtemp(prefix="raipack-phases-"))
    try:
        src = work / f"{args.model}-{cfg['num_hidden_layers']}{'-tiny' if args.tiny else ''}"
        if not (src / "model.safetensors").is_file():
            real_size.write_model(src, cfg)
        shutil.rmtree(work / "quark", ignore_errors=True)
        result = run(src, work, samples, seq_len)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
