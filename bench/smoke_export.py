"""The smoke stage's export side, the old way against the new, side by side on one package and export.

old: every prompt the smoke stage checks (the fixed prompt, one per prefill tier) decoded greedily by
     the export on its own: a prefill of the whole prompt in one call, then one call per new token.
new: what the stage does now (OrtDecoder.forced): the fixed prompt's tokens from one prefill and one
     call over the package's other tokens; every tier's from one prefill of the longest tier prompt in
     calls of EXPORT_CHUNK positions (each tier's prompt is a prefix of it), then one call per tier.
also: new with the longest prompt in one call (no chunking), to show what the chunking costs in time.

Each way runs `--repeat` times, interleaved, on the same decoder; the medians, their ratios, the calls
and the largest logits output one call allocates (rows x vocabulary x 4 bytes) are printed. Both ways
must choose the same tokens, else the script fails. Default inputs: the tests' tiny reference-4K
package and its export (tests/factory.py); `--package/--export` take a real build's stage folders.

    python bench/smoke_export.py [--package DIR --export DIR] [--repeat 3] [--max-tier 4096]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "tests"))


def prompts(pkg: Path, max_tier: int) -> tuple[list[int], list[int], list[int], int, int]:
    """(fixed prompt, longest tier prompt, tier prompt lengths, max_new_tokens, tier_new_tokens) as the stage makes them."""
    from raipack.runtime.chat import chat_ids, load_tokenizer
    from raipack.runtime.reference import ReferenceRuntime
    from raipack.stages.smoke.stage import PROMPT, SmokeConfig, prompt_lengths, tier_prompt

    cfg = SmokeConfig(max_tier=max_tier)
    tok = load_tokenizer(pkg)
    rt = ReferenceRuntime(pkg, verify="sizes")
    lengths = [n for _, n in prompt_lengths(rt.prefill_tiers, rt.max_prompt_length, cfg.max_tier, cfg.tier_new_tokens, cfg.all_tiers_up_to)]
    return chat_ids(tok, PROMPT), tier_prompt(tok, max(lengths)), lengths, cfg.max_new_tokens, cfg.tier_new_tokens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--package", type=Path)
    ap.add_argument("--export", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-tier", type=int, default=4096)
    args = ap.parse_args(argv)
    if args.package is None or args.export is None:
        from factory import reference_export, reference_package

        args.package, args.export = reference_package("reference-4K"), reference_export()[0]

    from raipack.runtime.ortloop import OrtDecoder
    from raipack.stages.smoke.stage import EXPORT_CHUNK

    fixed, longest, lengths, new, tier_new = prompts(args.package, args.max_tier)
    dec = OrtDecoder(args.export)
    calls: list[int] = []
    forward = dec.forward
    dec.forward = lambda ids, past: calls.append(ids.shape[1]) or forward(ids, past)  # type: ignore[method-assign]

    def old():
        return [dec.greedy(fixed, new)[0]] + [dec.greedy(longest[:n], tier_new)[0] for n in lengths]

    expected = old()  # the tokens the package gives when it matches the export

    def new_way(chunk):
        def run():
            got = dec.forced(fixed, {len(fixed): expected[0]}, EXPORT_CHUNK)[len(fixed)]
            tiers = dec.forced(longest, {n: t for n, t in zip(lengths, expected[1:])}, chunk)
            return [got] + [tiers[n] for n in lengths]
        return run

    ways = {"old": old, "new": new_way(EXPORT_CHUNK), "new, one call": new_way(None)}
    seconds: dict[str, list[float]] = {k: [] for k in ways}
    cpu: dict[str, list[float]] = {k: [] for k in ways}
    shape: dict[str, tuple[int, int]] = {}
    for _ in range(args.repeat):
        for name, way in ways.items():
            calls.clear()
            t, c = time.perf_counter(), time.process_time()
            tokens = way()
            seconds[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
            shape[name] = (len(calls), max(calls))
            if tokens != expected:
                print(f"{name}: the tokens differ from the old way's", file=sys.stderr)
                return 1
    vocab = int(dec.genai["model"].get("vocab_size", 0))
    print(f"export {args.export} (vocabulary {vocab}); prompts: fixed {len(fixed)} tokens + {new} new, tiers {lengths} + {tier_new} new")
    cbase = statistics.median(cpu["old"])
    for name, s in seconds.items():
        m = statistics.median(s)
        n, rows = shape[name]
        c = statistics.median(cpu[name])
        print(f"{name:14} {m:8.2f} s wall  {c:8.2f} CPU-s  CPU ratio {c / cbase:5.2f}  {n:4} calls  largest logits output {rows * vocab * 4 / 2**20:8.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
