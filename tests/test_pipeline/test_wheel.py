"""The wheel built from the repo installs one import name, `raipack`, with its data files, and runs.

Built from a copy of the tracked files (what a clean clone has; setuptools' build/ and egg-info never
land in the worktree), installed with --no-deps into a fresh venv that has no pip and no raipack. The
light dependencies (click, jsonschema, rich, onnx) come from the light venv's site-packages folders,
appended by a .pth file: site-packages folders only, whose own .pth files (an editable raipack's
finder among them) are not processed, so `raipack` can only come from the wheel.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def tracked_copy(dest: Path) -> Path:
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, text=True, timeout=60)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout, so what a clean clone holds is unknown: {listed.stderr.strip()}")
    for name in filter(None, listed.stdout.split("\0")):
        source = REPO / name
        if source.is_file():  # a file deleted in the worktree is not built
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def dependency_folders() -> list[str]:
    """The site-packages folders of the light venv (`make` makes .venv-light: the light base alone, so the
    wheel's `raipack validate` is shown to need no more), else of this interpreter."""
    light = REPO / ".venv-light" / "bin" / "python"
    python = str(light) if light.is_file() else sys.executable
    code = "import sys; print('\\n'.join(p for p in sys.path if p.endswith('site-packages')))"
    return subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout.split()


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the wheel, the fresh venv's python, its site-packages) with the wheel installed."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tracked_copy(tmp / "src")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir", "-q",
                            "--disable-pip-version-check", "-w", str(tmp / "dist"), str(source)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("raipack-*.whl")
    venv.create(tmp / "venv", with_pip=False, symlinks=True)
    python = tmp / "venv" / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    before = set(p.name for p in site.iterdir())
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                           "--disable-pip-version-check", str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    added = sorted(set(p.name for p in site.iterdir()) - before)
    (site / "zz-light-deps.pth").write_text("".join(f"{p}\n" for p in dependency_folders()))
    return wheel, python, site, added


def test_the_wheel_holds_only_raipack(installed):
    wheel, _, site, added = installed
    with zipfile.ZipFile(wheel) as zf:
        top = {name.split("/")[0] for name in zf.namelist()}
        record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        recorded = {line.split(",")[0].split("/")[0] for line in zf.read(record).decode().splitlines() if line}
    dist_info = {n for n in top if n.endswith(".dist-info")}
    assert top - dist_info == {"raipack"} and recorded - dist_info == {"raipack"}, sorted(top)
    assert [n for n in added if not n.endswith(".dist-info")] == ["raipack"], added  # nothing else lands in site-packages
    assert not (site / "pipeline").exists() and not (site / "stages").exists() and not (site / "schemas").exists()


def test_the_data_files_are_installed(installed):
    _, _, site, _ = installed
    pkg = site / "raipack"
    for folder, pattern in (("schemas", "*.json"), ("stages/quantize/data", "*.json"), ("stages/fuse/data", "*.json"),
                            ("data", "*.json"), ("profiles", "*.json"), ("report/templates", "*.html.j2"), ("batch/data", "*.json")):
        repo_folder = REPO / (folder if folder.split("/")[0] in ("schemas", "stages") else f"pipeline/{folder}")  # pyproject's package-dir
        wanted = sorted(p.name for p in repo_folder.glob(pattern))
        assert wanted and sorted(p.name for p in (pkg / folder).glob(pattern)) == wanted, folder


def test_the_installed_wheel_runs(installed, make_pkg, tmp_path):
    """`python -m raipack.cli` from an empty folder imports raipack from the wheel, and validates a package
    with its own schemas and profiles."""
    _, python, site, _ = installed
    where = subprocess.run([str(python), "-I", "-c", "import raipack, raipack.stages, raipack.schemas; print(raipack.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0 and Path(where.stdout.strip()).is_relative_to(site), where.stdout + where.stderr
    helped = subprocess.run([str(python), "-I", "-m", "raipack.cli", "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "validate" in helped.stdout and "build" in helped.stdout, helped.stdout + helped.stderr
    checked = subprocess.run([str(python), "-I", "-m", "raipack.cli", "validate", str(make_pkg("1.8.0-npu-16K"))],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
