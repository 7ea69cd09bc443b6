"""The reference runtime against onnxruntime-genai itself, at length (issue 13).

The factory's real `reference-16K` package (a tiny random Llama fused by the reference backend:
16K KV buffer, chunked prefill on, prefill tiers up to 4096) runs prompts of 100, 900 and 4090
token ids through `ReferenceRuntime`; onnxruntime-genai (CPU) runs the same ids on the export the
package was fused from, with the same `max_length`. Greedy, NEW tokens each: the token ids must be
equal and every logits row (the last prompt position's and each generated step's) within ATOL.

ATOL: the logits are float32 of magnitude ~130 here (an ulp is 1.5e-5), so 1e-4 leaves a few ulps
for another summation order (the runtime attends over its tier's KV window, onnxruntime-genai over
its whole buffer) while staying far below what the far context contributes: changing the first of
4090 prompt ids moves the last row by ~2e-2 (asserted below). Measured today: 0.0 at every length.
The tiny random model's greedy answer repeats one id with a top-2 margin of ~100, so equal tokens
prove little on their own: the logits rows carry the comparison, and a second run of each prompt feeds
NEW other ids one at a time (a token step fed the wrong id then shows).

The package as built runs every prompt up to 4096 in one prefill call (its chunk_size is its largest
prefill tier); chunked prefill is run on a copy tuned by `raipack tune --chunk-size 512`, which takes
any prompt longer than 512 ids in 512-id chunks (the longest call is the settings' one_pass()).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from factory import reference_export, reference_package
from helpers import edit_json
from raipack.runtime.run import calls_text

NEW = 8  # new tokens per prompt: at 4090 the last step runs position 4096, past the largest prefill tier
ATOL = 1e-4
LENGTHS = (100, 900, 4090)
TUNED_CHUNK = 512  # a prefill tier; `raipack tune --chunk-size 512` on a copy


def prompt_ids(n: int, vocab: int, seed: int | None = None) -> list[int]:
    """n deterministic ids of the vocabulary, above the special ids 0-2 (pad, bos, eos)."""
    return [int(i) for i in np.random.default_rng(n if seed is None else (seed, n)).integers(3, vocab, n)]


@pytest.fixture(scope="module")
def oga_model():
    import onnxruntime_genai as og

    return og.Model(str(reference_export()[0]))


@pytest.fixture(scope="module")
def oga_runs(oga_model):
    """run(ids, forced, max_length) -> what onnxruntime-genai did, computed once per prompt for the module:
    NEW greedy tokens and their logits rows, and the rows of a fresh run fed `forced` one id at a time."""
    import onnxruntime_genai as og

    done: dict = {}

    def generator(max_length: int, ids: list[int]):
        params = og.GeneratorParams(oga_model)
        params.set_search_options(max_length=max_length, do_sample=False)
        gen = og.Generator(oga_model, params)
        gen.append_tokens(ids)
        return params, gen

    def run(ids: list[int], forced: list[int], max_length: int) -> dict:
        key = (tuple(ids), tuple(forced), max_length)
        if key not in done:
            params, gen = generator(max_length, ids)
            tokens, rows = [], []
            for _ in range(NEW):
                rows.append(np.array(gen.get_logits())[0, -1].copy())
                gen.generate_next_token()
                tokens.append(int(gen.get_next_tokens()[0]))
            _, fed = generator(max_length, ids)
            forced_rows = [np.array(fed.get_logits())[0, -1].copy()]
            for t in forced:
                fed.append_tokens([t])
                forced_rows.append(np.array(fed.get_logits())[0, -1].copy())
            done[key] = {"tokens": tokens, "rows": rows, "forced_rows": forced_rows, "sequence": [int(t) for t in gen.get_sequence(0)],
                         "max_length": int(params.get_search_options()["max_length"]),
                         "kv_positions": np.array(gen.get_output("present.0.key")).shape[2]}
        return done[key]

    return run


@pytest.fixture(scope="module")
def runtime():
    from raipack.runtime.reference import ReferenceRuntime

    return ReferenceRuntime(reference_package("reference-16K"), threads=2)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A copy of reference-16K tuned by `raipack tune --chunk-size 512` (tune refuses a package whose
    manifest records genai_config.json, so the copy has none), with rai_config.json's prompt cap
    raised to 8192 so a prompt may exceed the largest prefill tier; loaded in the reference runtime."""
    from raipack import tune
    from raipack.runtime.reference import ReferenceRuntime

    pkg = tmp_path_factory.mktemp("tuned") / "reference-16K"
    shutil.copytree(reference_package("reference-16K"), pkg, ignore=shutil.ignore_patterns("manifest.json"))
    plan = tune.plan(pkg, None, None, TUNED_CHUNK)
    assert ("search.chunk_size", 4096, TUNED_CHUNK) in plan.changes
    tune.apply(plan)
    edit_json(pkg / "rai_config.json", lambda doc: {"max_prompt_length": dict.fromkeys(doc["max_prompt_length"], 8192)})
    rt = ReferenceRuntime(pkg, threads=2)
    assert rt.chunk_size == TUNED_CHUNK and rt.chunked
    return rt


def compare(rt, oga_runs, n: int) -> tuple[list[int], dict]:
    """Runs n prompt ids through `rt` and onnxruntime-genai; asserts they were given the same
    max_length and prompt, then equal greedy tokens and logits rows within ATOL, greedy and fed NEW
    other ids one at a time (this model's greedy tokens repeat one id; fed ids vary the token steps).
    `rt.calls` is left as the greedy run made it. Returns (ids, the OGA run)."""
    ids, forced = prompt_ids(n, rt.vocab_size), prompt_ids(NEW, rt.vocab_size, seed=n)
    want = oga_runs(ids, forced, rt.max_length)
    forced_rows = [rt.prefill(ids).copy()] + [rt.step(t).copy() for t in forced]
    got, rows = rt.generate(ids, NEW, return_logits=True)
    # onnxruntime-genai was given the runtime's max_length (its KV buffer has that many positions) and the ids
    assert want["max_length"] == want["kv_positions"] == rt.max_length
    assert want["sequence"][:n] == ids and want["sequence"][n:] == want["tokens"]
    assert got == want["tokens"]
    assert len(rows) == len(want["rows"]) == NEW and len(forced_rows) == len(want["forced_rows"]) == NEW + 1
    diff = max(float(np.abs(a - b).max()) for a, b in zip(rows + forced_rows, want["rows"] + want["forced_rows"]))
    assert diff <= ATOL, f"logits differ by {diff:.3g} at {n} prompt tokens (tolerance {ATOL})"
    return ids, want


def prefill_calls(rt) -> list[tuple[str, int, int]]:
    return [c for c in rt.calls if c[0] == "prefill"]


@pytest.mark.parametrize("n", LENGTHS)
def test_runtime_matches_onnxruntime_genai_at_length(runtime, oga_runs, n):
    """The package as built (chunk_size 4096 = the largest prefill tier): each prompt is one prefill
    call at the smallest tier that holds it, then one call per token."""
    ids, want = compare(runtime, oga_runs, n)
    assert [tier for _, tier, _ in prefill_calls(runtime)] == [min(t for t in runtime.prefill_tiers if t >= n)]
    assert len(runtime.calls) == NEW and runtime.filled == n + NEW - 1
    assert calls_text(runtime.prefill_calls()) == f"1 prefill call (tier {runtime.calls[0][1]})"
    largest = runtime.prefill_tiers[-1]
    if n == 4090:  # both ran positions past the largest prefill tier (the last new token is only emitted)
        assert runtime.filled > largest and len(want["sequence"]) - 1 > largest
        # the tolerance sees the far context: the first of 4090 ids changed moves the last row by far more
        moved = runtime.prefill([3 + (ids[0] - 2) % (runtime.vocab_size - 3)] + ids[1:])  # the next id, within 3..vocab-1
        assert float(np.abs(moved - want["rows"][0]).max()) > 10 * ATOL


def test_prompt_beyond_the_largest_prefill_tier_runs_in_chunks_and_matches(tuned, oga_runs):
    """4100 ids on the tuned copy: eight 512-token chunks and a last one of 4 ids padded to tier 128,
    each later chunk over the KV window of the token tier that holds its end."""
    n = tuned.prefill_tiers[-1] + 4
    compare(tuned, oga_runs, n)
    calls = prefill_calls(tuned)
    assert [tier for _, tier, _ in calls] == [TUNED_CHUNK] * 8 + [min(t for t in tuned.prefill_tiers if t >= 4)]
    assert len({window for _, _, window in calls}) > 1
    # what `raipack run` prints and the smoke report records: the calls the prefill made
    assert tuned.prefill_calls() == [tier for _, tier, _ in calls]
    assert calls_text(tuned.prefill_calls()) == f"9 prefill calls (tiers {TUNED_CHUNK}×8, {calls[-1][1]})"


def test_copy_tuned_to_512_token_chunks_matches_at_4090(tuned, oga_runs):
    """4090 ids on the tuned copy: tokens and logits as onnxruntime-genai's."""
    compare(tuned, oga_runs, 4090)


def test_copy_tuned_to_512_token_chunks_prefills_4090_ids_in_chunks(tuned):
    """The tuned copy takes a 4090-token prompt in ceil(4090 / 512) = 8 prefill calls of one chunk each
    (the last one, 506 ids, padded to the 512 tier): no call is longer than the chunk the settings say."""
    assert tuned.settings.one_pass() == TUNED_CHUNK
    tuned.prefill(prompt_ids(4090, tuned.vocab_size))
    calls = prefill_calls(tuned)
    assert [tier for _, tier, _ in calls] == [TUNED_CHUNK] * 8, calls
    assert calls_text(tuned.prefill_calls()) == f"8 prefill calls (tiers {TUNED_CHUNK}×8)"
