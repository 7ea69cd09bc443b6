"""Where the libraries torch and AMD Quark load come from, decided before either is imported.

Importing Quark loads compiled libraries at once: ``quark.onnx.operators.custom_ops`` (the BFP16
operator of ``--numerics bfp16``) and ``quark.torch`` (the quantize stage) each load their C++
extension, built by ``torch.utils.cpp_extension`` into torch's extensions folder and loaded from
there when it is up to date. Whoever chooses that folder chooses the code that runs. torch 2.13
decides it (``_get_build_directory``, ``get_default_build_root``, ``torch._appdirs.user_cache_dir``) as
``$TORCH_EXTENSIONS_DIR`` when set (even empty), else ``$XDG_CACHE_HOME/torch_extensions`` when that is
set (even empty), else ``~/.cache/torch_extensions`` (``$HOME``, or the password database without it);
a relative value is taken from the working directory. Compiling runs ``ninja`` and ``$CXX`` (default
``c++``) found through ``$PATH``.

:func:`check_origins` refuses, in one sentence naming the variable, before anything is imported:

- an extensions folder a relative (or empty) variable chooses, or one inside an input folder (the
  package), symlinks followed;
- an entry of ``PATH`` that is empty or relative (the working directory's programs would compile the
  library), and a relative ``CXX``;
- torch, Quark or onnxruntime found inside an input folder, or inside the working directory without
  being in one of this Python's site-packages folders (a ``quark/`` folder where ``python -m`` runs).

An absolute folder that merely lies under the working directory is accepted: running from ``$HOME``
puts ``~/.cache`` there. The library Quark returns is checked again after the import
(``raipack.runtime.numerics.quark_library``).
"""

from __future__ import annotations

import importlib.util
import os
import site
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from pathlib import Path

from raipack.core.errors import RaipackError

MODULES = ("torch", "quark", "onnxruntime")  # whose compiled libraries a --numerics bfp16 run or a quantize loads
HINT_FOLDER = "set it to an absolute folder outside any package (or unset it), then run again"


def extensions_root(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(the folder torch's extensions are built and loaded under, the variable that chose it), as torch
    2.13 decides it on Linux and macOS, without importing torch. The folder may be relative."""
    env = os.environ if environ is None else environ
    if "TORCH_EXTENSIONS_DIR" in env:
        return env["TORCH_EXTENSIONS_DIR"], "TORCH_EXTENSIONS_DIR"
    if sys.platform == "darwin":
        return os.path.join(_home(env), "Library", "Caches", "torch_extensions"), "HOME"
    if "XDG_CACHE_HOME" in env:
        return os.path.join(env["XDG_CACHE_HOME"], "torch_extensions"), "XDG_CACHE_HOME"
    return os.path.join(_home(env), ".cache", "torch_extensions"), "HOME"


def _home(env: Mapping[str, str]) -> str:
    """`~` as os.path.expanduser reads it: $HOME when set ("" is "/"), else the password database."""
    if "HOME" in env:
        return env["HOME"].rstrip("/") or "/"
    return os.path.expanduser("~")


def _inside(path: str, folder: Path) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(folder)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def check_origins(untrusted: Iterable[Path] = (), environ: Mapping[str, str] | None = None) -> Path:
    """The extensions folder torch will use (resolved), after refusing every way an input or the
    working directory could choose a library torch or Quark loads (RaipackError: one sentence and a hint)."""
    env = os.environ if environ is None else environ
    untrusted = [Path(u) for u in untrusted]
    root, var = extensions_root(env)
    value = env.get(var, "")
    if not os.path.isabs(root):
        raise RaipackError(f"{var} is {'empty' if not value else f'the relative path {value!r}'}: torch would build and load Quark's compiled library from "
                           f"{os.path.abspath(root)}, a folder the working directory chooses", HINT_FOLDER)
    for folder in untrusted:
        if _inside(root, folder):
            raise RaipackError(f"torch's extensions folder {root} (from {var}) lies inside {folder}: Quark's compiled library would be loaded from an input, "
                               "and raipack never loads a library from a package", HINT_FOLDER)
    _check_programs(env, untrusted)
    for name in MODULES:
        _check_module(name, untrusted)
    return Path(os.path.realpath(root))


def _check_programs(env: Mapping[str, str], untrusted: list[Path]) -> None:
    for entry in env.get("PATH", "").split(os.pathsep):
        if not os.path.isabs(entry):
            shown = "an empty entry" if not entry else f"the relative entry {entry!r}"
            raise RaipackError(f"PATH has {shown}: the compiler or ninja torch runs to build Quark's library could come from the working directory",
                               "remove it from PATH (write folders as absolute paths), then run again")
        for folder in untrusted:
            if _inside(entry, folder):
                raise RaipackError(f"PATH names {entry}, inside {folder}: the compiler torch runs to build Quark's library could come from an input",
                                   "remove it from PATH, then run again")
    cxx = env.get("CXX", "")
    if os.sep in cxx and not os.path.isabs(cxx):
        raise RaipackError(f"CXX is the relative path {cxx!r}: torch would compile Quark's library with a program the working directory chooses",
                           "set CXX to a compiler's absolute path, or unset it")


def _site_folders() -> list[str]:
    paths = sysconfig.get_paths()
    folders = [paths.get("purelib", ""), paths.get("platlib", ""), *getattr(site, "getsitepackages", list)()]
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    return [os.path.realpath(f) for f in folders if f]


def _check_module(name: str, untrusted: list[Path]) -> None:
    """`name`'s files (found without importing it) lie in no input, and not in the working directory
    unless they are in this Python's site-packages (a venv may sit under the working directory)."""
    module = sys.modules.get(name)
    try:
        spec = module.__spec__ if module is not None else importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return
    origin = spec.origin if spec is not None and spec.origin not in (None, "built-in", "frozen") else None
    if origin is None:
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        origin = locations[0] if locations else None
    if origin is None:
        return  # not installed: its import fails with its own sentence
    for folder in untrusted:
        if _inside(origin, folder):
            raise RaipackError(f"the module {name} would be imported from {origin}, inside {folder}: raipack never loads code from a package",
                               f"remove the {name} folder from there, and run raipack from another folder")
    if _inside(origin, Path.cwd()) and not any(_inside(origin, Path(s)) for s in _site_folders()):
        raise RaipackError(f"the module {name} would be imported from {origin}, in the working directory, not from this Python's site-packages",
                           f"run raipack from another folder, or remove the {name} folder there (PYTHONPATH and `python -m` put the working directory first)")
