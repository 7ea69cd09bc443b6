"""Import AMD Quark without ever hanging on a lock left behind by a killed build.

Importing ``quark.torch`` JIT-compiles Quark's C++ extension with
``torch.utils.cpp_extension``, which guards the build folder
(``$TORCH_EXTENSIONS_DIR/quark_hw_emulation_stable_abi``, by default under
``~/.cache/torch_extensions/py311_cpu``) with a ``lock`` file: created with ``O_EXCL``,
held open while compiling, removed when done. A process killed while compiling leaves
the file behind and every later import waits for it forever.

So raipack imports Quark only through :func:`import_quark`, which

1. unless the extension is already built (its ``.so`` there and no ``lock``: the import only
   loads it), serialises raipack's own imports with an ``flock`` on
   ``quark_hw_emulation_stable_abi.raipack.lock`` beside the build folder (the kernel
   drops an flock when its process dies, so this lock is never stale), waiting at most
   ``timeout`` seconds and saying so after a few;
2. holding it, looks at a leftover ``lock``: if a live process has it open, or runs
   inside the build folder (an orphaned ninja or compiler of a killed build), a compile
   outside raipack is under way and is waited for, within the same bound; otherwise the
   lock is stale: it and the half-built folder are removed and Quark compiles afresh;
3. imports Quark with torch's own wait on that lock bounded too, so a compile another
   program starts at that moment cannot hang the build either.

While it imports, it also spares Quark 0.13 most of its slowest import step: its MoE support
(``quark/torch/utils/llm/module_replacement/quark_experts.py``) ``ast.parse``-s every
``transformers/models/*/modeling_*.py`` (656 files) to find classes decorated
``use_experts_implementation``: 13.6 of the 17.6 s ``import quark.torch`` took (cProfile, one thread,
session 8). For that one caller, a file whose text does not name the decorator is returned as an empty
module without parsing (:func:`_experts_scan_prefiltered`); such a file cannot hold the decorator, so
Quark registers the same classes (tests/test_stages/test_quark_lock.py compares the registries).

Liveness is read from ``/proc`` (Linux). Processes of other users cannot be inspected;
they cannot write into this user's build folder either. Without ``/proc`` a leftover
lock is never called stale: the build waits, then fails with a sentence naming it.
"""

from __future__ import annotations

import ast
import fcntl
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from raipack.core.errors import RaipackError
from raipack.core.libraries import check_origins

EXPERTS_SCAN = "quark.torch.utils.llm.module_replacement.quark_experts"  # the module whose ast.parse scan is pre-filtered
EXPERTS_DECORATOR = "use_experts_implementation"
EXTENSION = "quark_hw_emulation_stable_abi"  # quark/torch/kernel/hw_emulation/extensions.py
TIMEOUT = 600.0  # seconds: compiling takes ~5 s of CPU; a loaded machine may take minutes
NOTICE_AFTER = 3.0
POLL = 0.2
CONFIRM = 0.5  # a lock must look dead twice this far apart: torch closes it before removing it

Say = Callable[[str], None]


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def extension_dir() -> Path:
    """The folder torch compiles Quark's extension into (honours ``TORCH_EXTENSIONS_DIR``)."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(EXTENSION, False))


def users(lock: Path) -> list[int] | None:
    """Pids of live processes that hold ``lock`` open or run inside its folder; ``None``
    when this cannot be known (no ``/proc``)."""
    proc = Path("/proc")
    if not (proc / "self" / "fd").is_dir():
        return None
    target = os.path.realpath(lock)
    folder = os.path.dirname(target)
    found = []
    for entry in os.scandir(proc):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"{entry.path}/cwd")
            if cwd == folder or cwd.startswith(folder + os.sep):
                found.append(int(entry.name))
                continue
            for fd in os.scandir(f"{entry.path}/fd"):
                if os.readlink(fd.path) == target:
                    found.append(int(entry.name))
                    break
        except OSError:  # gone meanwhile, or another user's process
            continue
    return found


def _stale(lock: Path) -> bool:
    """True when ``lock`` exists and no live process is behind it, seen twice."""
    for attempt in range(2):
        if attempt:
            time.sleep(CONFIRM)
        if not lock.exists() or users(lock) != []:
            return False
    return True


def wait_for_lock(lock: Path, deadline: float, say: Say | None = None) -> bool:
    """Wait until ``lock`` is gone (True) or stale (False: its compile was killed); raise a
    one-sentence error when it is still held at ``deadline`` (``time.monotonic()``)."""
    start = time.monotonic()
    told = False
    while lock.exists():
        if _stale(lock):
            return False
        if time.monotonic() >= deadline:
            pids = users(lock)
            who = f"process {', '.join(map(str, pids))}" if pids else "a process raipack cannot see"
            raise RaipackError(f"{lock} is still held by {who} after {time.monotonic() - start:.0f} s of waiting for its compile of AMD Quark's C++ extension",
                               f"stop that process, or delete {lock.parent} if no compile is running, then build again")
        if say and not told and time.monotonic() - start >= NOTICE_AFTER:
            say(f"  waiting for another program compiling AMD Quark's C++ extension ({lock})")
            told = True
        time.sleep(POLL)
    return True


@contextmanager
def build_lock(build_dir: Path, timeout: float = TIMEOUT, say: Say | None = _stderr) -> Iterator[float]:
    """Hold raipack's lock on ``build_dir`` with no stale torch lock inside; yields the
    deadline (``time.monotonic()``) the import must keep."""
    build_dir = Path(build_dir)
    start = time.monotonic()
    deadline = start + timeout
    flock_path = build_dir.parent / f"{build_dir.name}.raipack.lock"
    try:
        build_dir.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(flock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise RaipackError(f"cannot create {flock_path} to compile AMD Quark's C++ extension: {exc.strerror}",
                           "set TORCH_EXTENSIONS_DIR to a writable folder") from None
    try:
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - start
                if waited >= timeout:
                    raise RaipackError(f"another raipack build held {flock_path} for {waited:.0f} s while compiling AMD Quark's C++ extension",
                                       "let the other build finish or stop it, then build again") from None
                if say and not told and waited >= NOTICE_AFTER:
                    say(f"  waiting for another raipack build compiling AMD Quark's C++ extension ({flock_path})")
                    told = True
                time.sleep(POLL)
        if not wait_for_lock(build_dir / "lock", deadline, say):
            if say:
                say(f"  removing {build_dir}: a build was killed while compiling AMD Quark's C++ extension there")
            try:
                shutil.rmtree(build_dir)
            except OSError as exc:
                raise RaipackError(f"cannot remove {build_dir}, left by a build killed while compiling AMD Quark's C++ extension: {exc.strerror}",
                                   f"delete {build_dir} yourself, then build again") from None
        yield deadline
    finally:
        os.close(fd)  # releases the flock


def built(build_dir: Path) -> bool:
    """The extension is compiled and no compile is under way or was left half done: importing
    Quark only loads it, so other builds need not wait for this one."""
    return (build_dir / f"{EXTENSION}.so").is_file() and not (build_dir / "lock").exists()


@contextmanager
def _guard(build_dir: Path, timeout: float, say: Say | None) -> Iterator[float]:
    """raipack's lock around the import when it may compile; none when the extension is built
    (holding it across a 20-60 s import made parallel builds queue past ``timeout``). A compile
    torch still decides on then is guarded by its own lock, whose wait stays bounded."""
    if built(build_dir):
        yield time.monotonic() + timeout
        return
    with build_lock(build_dir, timeout, say) as deadline:
        yield deadline


@contextmanager
def _experts_scan_prefiltered() -> Iterator[None]:
    """Within the block, ``ast.parse`` called from Quark's experts scan skips a source that does not
    contain the decorator's name (an empty module, as parsing it would find no decorated class);
    every other caller, and every source that names it, is parsed as before."""
    parse = ast.parse

    def prefiltered(source: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(source, str) and EXPERTS_DECORATOR not in source and sys._getframe(1).f_globals.get("__name__") == EXPERTS_SCAN:
            return ast.Module(body=[], type_ignores=[])
        return parse(source, *args, **kwargs)

    ast.parse = prefiltered  # restored below; only Quark's import runs meanwhile
    try:
        yield
    finally:
        ast.parse = parse


def import_quark(timeout: float = TIMEOUT, say: Say | None = _stderr, untrusted: tuple[Path, ...] = ()) -> Any:
    """``import quark.torch`` (compiling its extension when needed) within ``timeout``
    seconds, or a one-sentence error; see the module docstring. Before the import, where its
    compiled extension would be loaded from is checked (:func:`raipack.core.libraries.check_origins`:
    no folder a relative variable or an `untrusted` input folder chooses)."""
    if "quark.torch" in sys.modules:
        return _with_kernel(sys.modules["quark.torch"])
    check_origins(untrusted)
    import importlib

    import torch.utils.cpp_extension as cpp_extension

    build_dir = extension_dir()
    with _guard(build_dir, timeout, say) as deadline:
        failure: list[RaipackError] = []

        class BoundedBaton(cpp_extension.FileBaton):
            def wait(self) -> None:
                lock = Path(self.lock_file_path)
                try:
                    if not wait_for_lock(lock, deadline, say):
                        raise RaipackError(f"{lock} was left by a compile of AMD Quark's C++ extension that was killed while raipack waited for it",
                                           "build again: the next build removes it and compiles the extension afresh")
                except RaipackError as exc:
                    failure.append(exc)
                    raise

        saved = cpp_extension.FileBaton
        cpp_extension.FileBaton = BoundedBaton  # type: ignore[misc]  # torch's lock class, replaced for this one import
        try:
            with _experts_scan_prefiltered():
                module = importlib.import_module("quark.torch")
        except Exception as exc:
            if failure:  # Quark turns any failure of the compile into a RuntimeError of its own
                raise failure[0] from None
            if not isinstance(exc, RuntimeError):
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RaipackError(f"AMD Quark's C++ extension could not be compiled or loaded in {build_dir}: {first}",
                               f"check that a C++ compiler and ninja work, or delete {build_dir} and build again") from None
        finally:
            cpp_extension.FileBaton = saved  # type: ignore[misc]
    return _with_kernel(module, build_dir)


def _with_kernel(module: Any, build_dir: Path | None = None) -> Any:
    """`quark.torch` itself when its compiled kernel came with it. Seen once on a fresh machine: the extension
    folder vanished while the import ran and Quark was left without `quark.torch.kernel`, so every later quantize
    of the process failed with Quark's own AttributeError. Quark's modules are dropped, so a later import tries
    again, and the sentence names the folder to rebuild."""
    if getattr(module, "kernel", None) is not None:
        return module
    build_dir = build_dir or extension_dir()
    for name in [n for n in sys.modules if n == "quark" or n.startswith("quark.")]:
        del sys.modules[name]
    raise RaipackError(f"AMD Quark was imported without its compiled kernel (quark.torch.kernel is missing); its C++ extension folder {build_dir} is incomplete",
                       f"delete {build_dir} and build again: raipack compiles the extension afresh")
