"""Small helpers the tests share for editing generated packages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest


def edit_json(path: Path, fn) -> None:
    doc = json.loads(Path(path).read_text())
    result = fn(doc)
    Path(path).write_text(json.dumps(doc if result is None else result, indent=2))


def ryzen(doc: dict) -> dict:
    """The RyzenAI options block of a 1.7+ genai_config (for editing)."""
    return doc["model"]["decoder"]["session_options"]["provider_options"][0]["RyzenAI"]


def ids(result) -> set[str]:
    return {f.check_id for f in result.findings if f.severity == "error"}


def open_in_chromium(page: Path, out: Path) -> tuple[Path, str, list[str]]:
    """Open `page` in Debian's headless chromium once: (screenshot, the DOM after load, the console lines).

    `make test` installs chromium when missing; without it this fails, unless RAIPACK_NO_BROWSER=1 says to skip."""
    exe = shutil.which("chromium")
    if exe is None:
        if os.environ.get("RAIPACK_NO_BROWSER") == "1":
            pytest.skip("chromium is not installed and RAIPACK_NO_BROWSER=1: the report was not opened in a browser")
        pytest.fail("chromium is not installed: run `make chromium` (apt-get install chromium), or set RAIPACK_NO_BROWSER=1 to skip this test")
    shot = out / f"{page.stem}.png"
    run = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={out / 'profile'}", "--enable-logging=stderr", "--v=0",
                          f"--screenshot={shot}", "--window-size=1280,2400", "--dump-dom", page.resolve().as_uri()],
                         capture_output=True, text=True, timeout=60, cwd=out)
    assert run.returncode == 0, run.stderr[-2000:]
    return shot, run.stdout, [x for x in run.stderr.splitlines() if ":CONSOLE" in x]


def run_cli(capsys, *args):
    """`raipack ARGS` in this process: (exit code, stdout, stderr)."""
    from raipack.cli import main

    with pytest.raises(SystemExit) as info:
        main(list(map(str, args)))
    out, err = capsys.readouterr()
    return info.value.code, out, err
