"""The export stage's parity, transformers' side the old way against the new, side by side.

old: transformers decodes each parity prompt greedily on its own, `steps` forward calls with its KV cache
     (the logits row of every step kept).
new: what parity does now (stages/export/parity.py `_hf_forced`): one forward over the prompt and the
     export's greedy tokens, the lm_head computed on the generated rows only (`logits_to_keep`).
The export's own greedy decode (the same in both) is timed once beside them. Each way runs `--repeat`
times, interleaved, on one loaded model; both must find the same greedy tokens where they agree with
the export, else the script fails. Default inputs: the tests' tiny Quark export and its OGA export
(tests/factory.py); `--quark/--export` take a real build's stage folders.

    python bench/export_parity.py [--quark DIR --export DIR] [--steps 32] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "tests"))


def hf_greedy(model, ids: list[int], steps: int) -> list[int]:
    """The old side: transformers' own greedy decode, one call per step."""
    import inspect

    import torch

    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # transformers 5 / 4
    tokens = []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=True)
        for step in range(steps):
            tokens.append(int(out.logits[0, -1].float().argmax()))
            if step == steps - 1:
                break
            out = model(input_ids=torch.tensor([[tokens[-1]]]), use_cache=True, **{key: out[key]})
    return tokens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quark", type=Path)
    ap.add_argument("--export", type=Path)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    if args.quark is None or args.export is None:
        from factory import reference_export

        args.export, args.quark = reference_export()

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from raipack.runtime.ortloop import OrtDecoder
    from raipack.runtime.quark_hf import dequantize_once
    from raipack.stages.export.parity import _hf_forced
    from raipack.stages.export.stage import PROMPTS
    from raipack.stages.quark_import import import_quark

    import_quark()
    tok = AutoTokenizer.from_pretrained(str(args.quark))
    model = AutoModelForCausalLM.from_pretrained(str(args.quark), dtype=torch.float32).eval()
    dequantize_once(model)
    dec = OrtDecoder(args.export)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    t = time.perf_counter()
    onnx = [dec.greedy(ids, args.steps)[0] for ids in prompts]
    onnx_s = time.perf_counter() - t

    def old():
        return [hf_greedy(model, ids, args.steps) for ids in prompts]

    def new():
        return [[int(x) for x in np.argmax(_hf_forced(model, ids, o), axis=-1)] for ids, o in zip(prompts, onnx)]

    seconds: dict[str, list[float]] = {"old": [], "new": []}
    cpu: dict[str, list[float]] = {"old": [], "new": []}
    found = {}
    for _ in range(args.repeat):
        for name, way in (("old", old), ("new", new)):
            t, c = time.perf_counter(), time.process_time()
            found[name] = way()
            seconds[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
    for o, a, b in zip(onnx, found["old"], found["new"]):  # up to the first divergence from the export, both ways agree
        cut = next((i for i, (x, y) in enumerate(zip(o, a)) if x != y), len(o))
        if a[: cut + 1] != b[: cut + 1]:
            print("the two ways disagree before the export diverges", file=sys.stderr)
            return 1
    cbase = statistics.median(cpu["old"])
    print(f"quark {args.quark}; {len(prompts)} prompts x {args.steps} steps; export's own greedy decode {onnx_s:.2f} s")
    for name, s in seconds.items():
        c = statistics.median(cpu[name])
        print(f"transformers {name:4} {statistics.median(s):8.2f} s wall  {c:8.2f} CPU-s  CPU ratio {c / cbase:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
