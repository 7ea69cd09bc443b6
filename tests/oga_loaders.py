"""The real onnxruntime-genai loaders of the Ryzen AI releases, each in a small side folder.

`loader(version)` installs that version's wheel from the package registry with `pip install --no-deps
--target build/oga-loaders/<version>` once (a file lock makes pytest-xdist workers share it); it runs
beside the test venv's onnxruntime, which every wheel from 0.9 on loads. `verdicts(version, folders)`
asks that loader, in one subprocess, for `og.Config(folder)` on each folder: None when it loads, else
the loader's message. The venv's own version ("current") needs no install.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "build" / "oga-loaders"
RELEASE_LOADERS = ("0.9.2", "0.11.2", "0.14.0")  # Ryzen AI 1.6, 1.7, 1.8 (pipeline/data/ryzenai_releases.json)
PROBE = r"""
import json, sys
import onnxruntime_genai as og
folders = json.load(sys.stdin)
out = {}
for folder in folders:
    try:
        og.Config(folder)
        out[folder] = None
    except Exception as exc:
        out[folder] = str(exc)
json.dump({"version": getattr(og, "__version__", "?"), "verdicts": out}, sys.stdout)
"""


def current() -> str:
    from importlib.metadata import version

    return version("onnxruntime-genai")


def loader(version: str) -> Path | None:
    """The folder holding onnxruntime-genai `version` (None: the venv's own)."""
    if version == current():
        return None
    target = ROOT / version
    ROOT.mkdir(parents=True, exist_ok=True)
    with open(ROOT / f".{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / ".installed").exists():
            subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps",
                            "--target", str(target), f"onnxruntime-genai=={version}"], check=True)
            (target / ".installed").touch()
    return target


def verdicts(version: str, folders: list[str]) -> tuple[str, dict[str, str | None]]:
    """(the version the loader reports, folder -> None or the loader's refusal)."""
    env = dict(os.environ)
    where = loader(version)
    if where is not None:
        env["PYTHONPATH"] = str(where)
    done = subprocess.run([sys.executable, "-P", "-c", PROBE], input=json.dumps(folders), capture_output=True, text=True, env=env,
                          timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"onnxruntime-genai {version} probe failed: {done.stderr[-2000:]}")
    out = json.loads(done.stdout)
    return out["version"], out["verdicts"]
