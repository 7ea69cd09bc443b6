"""Issue 37, item 4: `--numerics bfp16` loaded a library from the working folder or the package. Importing
AMD Quark loads its compiled custom-op library from torch's extensions folder, and raipack checked where
the library came from only after the import: with a relative XDG_CACHE_HOME the library came from
./.cache/torch_extensions/... of the working folder, and with TORCH_EXTENSIONS_DIR inside the package a
planted library's constructor ran before raipack's refusal was printed. Now every variable that chooses
that folder (TORCH_EXTENSIONS_DIR, XDG_CACHE_HOME, HOME), the programs a compile runs (PATH, CXX) and the
modules' own places are checked before anything is imported (raipack.core.libraries).

Each case plants a real library whose constructor writes a marker file (tests/planted.py) where torch
would load Quark's library from: a copy of this machine's compiled extension folder with the library
swapped, so that torch finds it up to date and loads it (as on b938a75), or the library alone where no
compiled folder exists yet. The command runs in a child process; the marker must stay absent and the
exit be one sentence."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from factory import make_package
from planted import compile_library
from raipack.core.errors import RaipackError
from raipack.core.libraries import check_origins, extensions_root

pytest.importorskip("quark", reason="--numerics bfp16 needs amd-quark (raipack's build extra)")

TAG = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}_cpu"  # torch's build folder: the venv's torch is a CPU build
EXTENSIONS = ("quark_custom_ops_stable_abi", "quark_hw_emulation_stable_abi")  # what importing Quark loads (amd-quark 0.13)


def real_build_root() -> Path | None:
    """This machine's torch extensions folder of this Python, when it is absolute (the one torch uses here)."""
    root, _ = extensions_root()
    if not os.path.isabs(root):
        return None
    return Path(root) if "TORCH_EXTENSIONS_DIR" in os.environ else Path(root) / TAG


def plant(folder: Path, marker: Path) -> None:
    """torch's extension folders for Quark's libraries under `folder`, each library one that writes `marker`."""
    real = real_build_root()
    for name in EXTENSIONS:
        target = folder / name
        if real is not None and (real / name / f"{name}.so").is_file() and not target.exists():
            shutil.copytree(real / name, target)  # build.ninja and objects: torch finds the library up to date and loads it
        compile_library(target / f"{name}.so", marker)


@pytest.fixture(scope="module")
def pkg(tmp_path_factory):
    return make_package(tmp_path_factory.mktemp("origin"), "1.8.0-npu-16K")


def child_env(**changes):
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME", "PYTHONPATH")}
    env["OMP_NUM_THREADS"] = "1"
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_bfp16(pkg, cwd, env, *, module=False):
    """`raipack run PKG --numerics bfp16` in a child process started in `cwd`."""
    head = [sys.executable, "-m", "raipack.cli"] if module else [sys.executable, "-P", "-m", "raipack.cli"]
    return subprocess.run([*head, "run", str(pkg), "--numerics", "bfp16", "--prompt", "hi"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def quark_library_child(pkg, cwd, env):
    """raipack.runtime.numerics.quark_library(untrusted=(PKG,)) in a child process: the one place every
    bfp16 run (run, eval, bench's child, smoke) gets Quark's library from; it prints the refusal."""
    code = ("import sys\nfrom pathlib import Path\nfrom raipack.core.errors import RaipackError\nfrom raipack.runtime.numerics import quark_library\n"
            "try:\n    print(quark_library(untrusted=(Path(sys.argv[1]),)))\nexcept RaipackError as exc:\n    print(f'ERROR: {exc}'); sys.exit(1)\n")
    return subprocess.run([sys.executable, "-P", "-c", code, str(pkg)], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def one_sentence(ran, *words):
    lines = [line for line in ran.stdout.splitlines() + ran.stderr.splitlines() if line.startswith("ERROR: ")]
    assert len(lines) == 1, (ran.stdout, ran.stderr[-2000:])
    assert all(w in lines[0] for w in words), lines[0]
    assert "Traceback" not in ran.stderr


# ------------------------------------------------------------------ the two reproductions of the issue

def test_a_relative_xdg_cache_home_loads_nothing_from_the_working_folder(pkg, tmp_path):
    work, marker = tmp_path / "work", tmp_path / "MARKER"
    plant(work / ".cache" / "torch_extensions" / TAG, marker)
    ran = quark_library_child(pkg, work, child_env(XDG_CACHE_HOME=".cache"))
    assert not marker.exists(), "the planted library's constructor ran"
    assert ran.returncode == 1
    one_sentence(ran, "XDG_CACHE_HOME is the relative path '.cache'", str(work / ".cache" / "torch_extensions"))
    ran = run_bfp16(pkg, work, child_env(XDG_CACHE_HOME=".cache"))
    assert not marker.exists() and ran.returncode == 1
    one_sentence(ran, "XDG_CACHE_HOME is the relative path '.cache'")


def test_torch_extensions_dir_inside_the_package_is_refused_before_the_import(pkg, tmp_path):
    inside = tmp_path / pkg.name
    shutil.copytree(pkg, inside)
    marker = tmp_path / "MARKER"
    plant(inside / "ext", marker)
    env = child_env(TORCH_EXTENSIONS_DIR=str(inside / "ext"))
    ran = quark_library_child(inside, tmp_path, env)
    assert not marker.exists(), "the planted library's constructor ran before the refusal"
    assert ran.returncode == 1
    one_sentence(ran, f"{inside / 'ext'} (from TORCH_EXTENSIONS_DIR) lies inside {inside}")
    ran = run_bfp16(inside, tmp_path, env)
    assert not marker.exists() and ran.returncode == 1
    one_sentence(ran, "TORCH_EXTENSIONS_DIR", "lies inside")


# ------------------------------------------------------------------ every other variable that chooses the folder

@pytest.mark.parametrize("changes, planted_at, words", [
    ({"TORCH_EXTENSIONS_DIR": "ext"}, "ext", ["TORCH_EXTENSIONS_DIR is the relative path 'ext'"]),
    ({"TORCH_EXTENSIONS_DIR": ""}, ".", ["TORCH_EXTENSIONS_DIR is empty"]),
    ({"XDG_CACHE_HOME": ""}, f"torch_extensions/{TAG}", ["XDG_CACHE_HOME is empty"]),
    ({"HOME": "home"}, f"home/.cache/torch_extensions/{TAG}", ["HOME is the relative path 'home'"]),
], ids=["relative-torch-extensions-dir", "empty-torch-extensions-dir", "empty-xdg-cache-home", "relative-home"])
def test_a_variable_the_working_folder_would_decide_is_refused(pkg, tmp_path, changes, planted_at, words):
    work, marker = tmp_path / "work", tmp_path / "MARKER"
    plant(work / planted_at, marker)
    ran = run_bfp16(pkg, work, child_env(**changes))
    assert not marker.exists()
    assert ran.returncode == 1
    one_sentence(ran, *words)


def test_a_relative_path_entry_is_refused(pkg, tmp_path):
    """torch compiles Quark's library with ninja and c++ found through PATH: an empty entry is the working folder."""
    ran = run_bfp16(pkg, tmp_path, child_env(PATH=os.pathsep.join(["", os.environ.get("PATH", "/usr/bin")])))
    assert ran.returncode == 1
    one_sentence(ran, "PATH has an empty entry")


def test_a_quark_folder_in_the_working_folder_is_not_imported(pkg, tmp_path):
    """`python -m` puts the working folder first on sys.path: a quark/ there would be imported instead of Quark."""
    marker = tmp_path / "MARKER"
    (tmp_path / "quark").mkdir()
    (tmp_path / "quark" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    ran = run_bfp16(pkg, tmp_path, child_env(), module=True)
    assert not marker.exists()
    assert ran.returncode == 1
    one_sentence(ran, "the module quark would be imported from", "working directory")


# ------------------------------------------------------------------ in process: the decision itself

def test_the_folder_is_decided_as_torch_decides_it(tmp_path):
    from torch.utils.cpp_extension import get_default_build_root

    assert extensions_root({"TORCH_EXTENSIONS_DIR": "/x", "XDG_CACHE_HOME": "/y"}) == ("/x", "TORCH_EXTENSIONS_DIR")
    assert extensions_root({"XDG_CACHE_HOME": "/y", "HOME": "/h"}) == ("/y/torch_extensions", "XDG_CACHE_HOME")
    assert extensions_root({"HOME": "/h"}) == ("/h/.cache/torch_extensions", "HOME")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_EXTENSIONS_DIR"}
    assert os.path.realpath(extensions_root(env)[0]) == get_default_build_root()


def test_an_absolute_folder_outside_the_inputs_is_accepted(tmp_path):
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "PATH": "/usr/bin:/bin"}
    assert check_origins((tmp_path / "pkg",), env) == tmp_path / "ext"
    with pytest.raises(RaipackError, match="lies inside"):
        check_origins((tmp_path,), env)
    with pytest.raises(RaipackError, match="CXX is the relative path"):
        check_origins((), {**env, "CXX": "bin/c++"})
