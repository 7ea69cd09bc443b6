"""Can the NPU run this package here? One answer, asked by the smoke stage, `raipack bench`, `raipack eval`
and `raipack doctor` alike.

The checks, in this order (the first that fails is the reason):
1. provider_library: a RyzenAI provider library where the user put it, never from the package, the other
   untrusted folders or the current folder (pipeline/runtime/provider.py);
2. package: the package's genai_config.json names no library and no other provider (onnxruntime-genai
   would load what it names);
3. onnxruntime_genai: installed, found on `sys.path` without the current folder;
4. npu: the NPU and its driver (pipeline/runtime/probes.py: amdxdna and /dev/accel on Linux, the signed
   driver on Windows);
5. library_loads: the provider library loads, in an isolated child process started in an empty folder;
6. ryzenai_provider: onnxruntime-genai knows the RyzenAI provider (a child process, nothing loaded).

The static checks come first, so nothing is loaded, even in a child, while a static one fails. Callers that
go on to run something stop at the first failure; doctor asks every check (`every=True`) to report each
fact, and its answer is the same. A check whose answer is unclear (`ok=None`, e.g. onnxruntime-genai said
something unexpected) does not block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.machinery import PathFinder
from pathlib import Path

from raipack.runtime import probes
from raipack.runtime.provider import EP_ENV, find_provider_library, package_problem

ORDER = ("provider_library", "package", "onnxruntime_genai", "npu", "library_loads", "ryzenai_provider")


@dataclass(frozen=True)
class Check:
    name: str  # one of ORDER
    ok: bool | None  # None: no clear answer, or not asked (no library to load); never blocks
    detail: str  # one line: why not, or what was found


@dataclass
class Readiness:
    checks: list[Check] = field(default_factory=list)
    library: Path | None = None  # the provider library a child process may load (EP_ENV)
    npu: dict | None = None  # probes.npu_device()'s answer, when it was asked

    @property
    def ready(self) -> bool:
        return not any(c.ok is False for c in self.checks)

    @property
    def reason(self) -> str:
        """Why the NPU cannot run the package here, in one line ("" when it can)."""
        return next((c.detail for c in self.checks if c.ok is False), "")

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    def child_env(self) -> dict:
        """What a child process that runs the package on the NPU adds to its environment."""
        return {EP_ENV: str(self.library)} if self.library else {}


def genai_installed() -> bool:
    """onnxruntime-genai can be imported from `sys.path` without the current folder (nothing is imported)."""
    return PathFinder.find_spec("onnxruntime_genai", probes.search_path()) is not None


def npu_readiness(package: Path | None, untrusted_folders=(), every: bool = False) -> Readiness:
    """The answer for `package` (None: the machine alone) on this machine. No library is loaded from
    `package`, `untrusted_folders` (the model folder, the export) or the current folder."""
    folders = [Path(f).resolve() for f in ([package] if package else []) + [f for f in untrusted_folders if f]]
    out = Readiness()

    def add(name: str, ok: bool | None, detail: str) -> bool:
        out.checks.append(Check(name, ok, detail))
        return ok is not False or every

    library, why = find_provider_library(folders)
    out.library = library
    if not add("provider_library", library is not None, why or str(library)):
        return out
    if package is not None:
        problem = package_problem(Path(package).resolve())
        if not add("package", not problem, problem or "names no library and no other provider"):
            return out
    genai = genai_installed()
    if not add("onnxruntime_genai", genai, "found" if genai else "onnxruntime-genai is not installed"):
        return out
    out.npu = probes.npu_device()
    if not add("npu", out.npu["present"], out.npu["detail"] if out.npu["present"] else f"no NPU here: {out.npu['detail']}"):
        return out
    loads, load_why = probes.library_loads(library) if library else (None, "")
    if not add("library_loads", loads, f"the RyzenAI provider library {library} does not load: {load_why}" if loads is False else load_why):
        return out
    known, how = probes.provider_known() if genai else (False, "onnxruntime-genai is not installed")
    add("ryzenai_provider", known, how)
    return out
