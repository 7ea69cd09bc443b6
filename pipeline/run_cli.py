"""`raipack run`: one prompt through the reference runtime, the way the NPU runtime would run it."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import RaipackError, UsageError


def run_prompt(package: Path, prompt: str, max_new_tokens: int, raw: bool, threads: int | None, sdk_version: str | None) -> int:
    import click

    from .build_cli import OFFLINE

    os.environ.update(OFFLINE)
    if not Path(package).is_dir():
        raise UsageError(f"{package} is not a package folder", "give the folder raipack build wrote (its last lines name it)")
    from stages.fuse.runtime import PackageError, ReferenceRuntime, RuntimeRefusal
    from stages.smoke.chat import chat_ids, load_tokenizer, timed_generate

    try:
        runtime = ReferenceRuntime(package, threads=threads, sdk_version=sdk_version)
        tok = load_tokenizer(Path(package))
        ids = chat_ids(tok, prompt, chat=not raw)
        if len(ids) + max_new_tokens > runtime.max_length:
            max_new_tokens = max(1, runtime.max_length - len(ids))
        out = timed_generate(runtime, ids, max_new_tokens)
    except RuntimeRefusal as exc:
        raise RaipackError(str(exc), "shorten the prompt, or pass --sdk-version for a release with a larger limit") from None
    except PackageError as exc:
        raise RaipackError(str(exc), exc.hint) from None
    tokens = [t for t in out.tokens if t not in runtime.eos_token_ids]
    click.echo(tok.decode(tokens, skip_special_tokens=True).strip())
    click.echo(f"[cpu-reference] {len(ids)} prompt tokens, first token {out.ttft * 1000:.0f} ms, {len(out.tokens)} tokens at {out.decode_tps:.1f} tok/s", err=True)
    return 0
