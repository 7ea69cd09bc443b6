"""`raipack run`: one prompt through the reference runtime, the way the NPU runtime would run it.

Exit codes: 0 answered; 1 the package cannot be run (a file missing, corrupt, changed since the
build or outside the package; the prompt longer than the package takes); 2 usage error (PACKAGE
is not a folder, the prompt is not UTF-8 text, a bad option, `--numerics bfp16` without amd-quark).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from raipack.core.env import OFFLINE
from raipack.core.errors import RaipackError, UsageError
from raipack.runtime.numerics import HONEST, ready

# Unusual values in a package's files that the runtime's own checks did not name: still one sentence.
LOAD_ERRORS = (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError, MemoryError, RecursionError)


def utf8_prompt(prompt: str) -> str:
    """The prompt, refused (UsageError) when the command line gave bytes that are not UTF-8."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        ch = prompt[exc.start]
        byte = f"byte 0x{ord(ch) - 0xDC00:02x}" if 0xDC80 <= ord(ch) <= 0xDCFF else f"character U+{ord(ch):04X}"
        raise UsageError(f"the prompt is not valid UTF-8 text ({byte} at position {exc.start})", "pass the prompt as UTF-8 text") from None
    return prompt


@dataclass
class Answer:
    text: str
    notes: list[str]  # for stderr: what was not checked
    stats: str  # for stderr: the backend, lengths and speed


@dataclass(frozen=True)
class RunOptions:
    """How `raipack run` answers: the options beside the package and the prompt."""

    max_new_tokens: int = 64
    raw: bool = False  # no chat template
    threads: int | None = None
    sdk_version: str | None = None  # whose max_prompt_length applies
    numerics: str = "float"  # or "bfp16"


def answer(package: Path, prompt: str, opts: RunOptions) -> Answer:
    max_new_tokens, raw, threads, sdk_version, numerics = opts.max_new_tokens, opts.raw, opts.threads, opts.sdk_version, opts.numerics

    ready([numerics], untrusted=(Path(package),))  # before anything loads: one sentence, exit 2 (1: a library from the package)

    os.environ.update(OFFLINE)
    if not Path(package).is_dir():
        raise UsageError(f"{package} is not a package folder", "give the folder raipack build wrote (its last lines name it)")
    prompt = utf8_prompt(prompt)
    # late: loads the tokenizer/onnxruntime helpers only when a package answers; tests stub chat.timed_generate
    from raipack.runtime.chat import chat_ids, load_tokenizer, timed_generate
    from raipack.runtime.reference import ReferenceRuntime, RuntimeRefusal  # late: as above
    from raipack.runtime.trust import first_line  # late: as above

    try:
        try:
            runtime = ReferenceRuntime(package, threads=threads, sdk_version=sdk_version, numerics=numerics)
        except LOAD_ERRORS as exc:
            raise RaipackError(f"{package} cannot be run: a value in its files is not what the reference runtime expects ({first_line(exc)})",
                               "check it with raipack validate --verify-hashes, and rebuild it") from None
        runtime.files.check_sizes(("tokenizer", "chat_template"), "tokenizer file")
        tok = load_tokenizer(Path(package))
        ids = chat_ids(tok, prompt, chat=not raw)
        if len(ids) + max_new_tokens > runtime.max_length:
            max_new_tokens = max(1, runtime.max_length - len(ids))
        out = timed_generate(runtime, ids, max_new_tokens)
    except RuntimeRefusal as exc:
        raise RaipackError(str(exc), "shorten the prompt, or pass --sdk-version for a release with a larger limit") from None
    notes = [] if runtime.manifest_checked else [
        f"note: {Path(package) / 'manifest.json'} is missing, so the weights files were not checked against the hashes of the build"]
    if numerics != "float":
        notes.append(f"note: --numerics {numerics}: {HONEST}")
    tokens = [t for t in out.tokens if t not in runtime.eos_token_ids]
    stats = f"[cpu-reference{', ' + numerics if numerics != 'float' else ''}] {len(ids)} prompt tokens in {calls_text(runtime.prefill_calls())}, first token {out.ttft * 1000:.0f} ms, {len(out.tokens)} tokens at {out.decode_tps:.1f} tok/s"
    return Answer(tok.decode(tokens, skip_special_tokens=True).strip(), notes, stats)


def calls_text(tiers: list[int]) -> str:
    """'1 prefill call (tier 128)', '9 prefill calls (tiers 512×8, 128)': runs of one tier counted."""
    runs: list[list[int]] = []
    for t in tiers:
        if runs and runs[-1][0] == t:
            runs[-1][1] += 1
        else:
            runs.append([t, 1])
    what = ", ".join(f"{t}×{k}" if k > 1 else str(t) for t, k in runs)
    return f"{len(tiers)} prefill call{'s' if len(tiers) != 1 else ''} (tier{'s' if len(tiers) != 1 else ''} {what})"
