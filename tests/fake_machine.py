"""A fake Ryzen AI machine for the readiness probes (pipeline/runtime/probes.py) we cannot run here: the
NPU, the provider library loading, onnxruntime-genai knowing RyzenAI. The static checks (where the
library is, what the package names, whether onnxruntime-genai is installed) stay real."""

from __future__ import annotations

from pathlib import Path

from raipack.runtime import probes

# A stand-in onnxruntime_genai for a child process: its model loads on RyzenAI (mode "ryzenai"), on the CPU
# ("cpu"), or logs a fallback on stderr ("stderr"); its generator counts up from 41.
FAKE_OGA = """import sys
__version__ = "0.0-fake"
MODE = {mode!r}
class Model:
    def __init__(self, path):
        if MODE == "stderr":
            print("2026-01-01 [W:onnxruntime:, ryzenai] Falling back to CPU execution provider", file=sys.stderr)
    @property
    def device_type(self):
        return "CPU" if MODE == "cpu" else "RyzenAI"
class GeneratorParams:
    def __init__(self, model): pass
    def set_search_options(self, **kw): pass
class Generator:
    def __init__(self, model, params): self.n = 0
    def append_tokens(self, ids): pass
    def is_done(self): return False
    def generate_next_token(self): self.n += 1
    def get_next_tokens(self): return [40 + self.n]
"""


def fake_machine(monkeypatch, *, npu: bool = True, loads: bool = True, known: bool | None = True) -> None:
    """Replace the probes: an NPU with a 1.8-era driver (or none), a provider library that loads (or
    whose loading fails like an empty file's), an onnxruntime-genai that knows RyzenAI (or does not)."""
    device = ({"present": True, "driver": "32.0.203.280", "detail": "fake NPU"} if npu
              else {"present": False, "driver": None, "detail": "amdxdna driver not loaded (fake)"})
    monkeypatch.setattr(probes, "npu_device", lambda: device)
    monkeypatch.setattr(probes, "library_loads", lambda path: (True, "") if loads else (False, "file too short (fake)"))
    detail = {True: "fake: it registers the RyzenAI provider", False: "fake: Unknown provider name 'RyzenAI'", None: "fake: no clear answer"}[known]
    monkeypatch.setattr(probes, "provider_known", lambda: (known, detail))


def fake_oga(folder: Path, mode: str = "ryzenai") -> Path:
    """A folder holding the fake onnxruntime_genai of `mode`: put it on a child's PYTHONPATH."""
    package = folder / "fake-oga" / "onnxruntime_genai"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_OGA.format(mode=mode))
    return package.parent
