"""The `ryzenai-sdk` fuse backend: AMD's own `model_generate`, when it is installed.

The tool is Windows-only and closed; raipack only calls it with the argument
form in data/sdk_backend.json and then runs the same output checks as on its
own packages. The contract is tested with a fake executable.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from pipeline.core.errors import RaipackError

DATA = Path(__file__).with_name("data") / "sdk_backend.json"


def settings() -> dict:
    return json.loads(DATA.read_text("utf-8"))


def find_tool() -> str | None:
    cfg = settings()
    explicit = os.environ.get(cfg["env"])
    if explicit:
        return explicit if Path(explicit).is_file() else None
    return shutil.which(cfg["executable"])


def argv(tool: str, profile: dict, export_dir: Path, out_dir: Path) -> list[str]:
    cfg = settings()
    mode = "hybrid" if profile["target"] == "hybrid" else profile.get("fusion") or "token"
    values = {"out": str(out_dir), "in": str(export_dir), "max_seq_len": str(profile.get("context") or 4096)}
    return [tool] + [a.format(**values) for a in cfg["argv"][mode]]


def generate(profile: dict, export_dir: Path, out_dir: Path) -> dict:
    tool = find_tool()
    if tool is None:
        raise RaipackError("AMD's model_generate is not installed (it ships with the Ryzen AI SDK, on Windows)", "use --backend reference, or install the Ryzen AI SDK and put model_generate on PATH")
    cmd = argv(tool, profile, export_dir, out_dir)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=settings()["timeout_s"])
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RaipackError(f"model_generate could not run: {exc}", "check the Ryzen AI SDK installation") from None
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        raise RaipackError(f"model_generate failed: {last[0][:300]}", "see model_generate's log; raipack checks its output only when it succeeds")
    return {"backend": "ryzenai-sdk", "command": cmd, "seconds": round(time.perf_counter() - start, 2), "log_tail": proc.stdout.strip().splitlines()[-5:]}
