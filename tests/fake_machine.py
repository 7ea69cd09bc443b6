"""A fake Ryzen AI machine for the readiness probes (pipeline/runtime/probes.py) we cannot run here: the
NPU, the provider library loading, onnxruntime-genai knowing RyzenAI. The static checks (where the
library is, what the package names, whether onnxruntime-genai is installed) stay real."""

from __future__ import annotations

from raipack.runtime import probes


def fake_machine(monkeypatch, *, npu: bool = True, loads: bool = True, known: bool | None = True) -> None:
    """Replace the probes: an NPU with a 1.8-era driver (or none), a provider library that loads (or
    whose loading fails like an empty file's), an onnxruntime-genai that knows RyzenAI (or does not)."""
    device = ({"present": True, "driver": "32.0.203.280", "detail": "fake NPU"} if npu
              else {"present": False, "driver": None, "detail": "amdxdna driver not loaded (fake)"})
    monkeypatch.setattr(probes, "npu_device", lambda: device)
    monkeypatch.setattr(probes, "library_loads", lambda path: (True, "") if loads else (False, "file too short (fake)"))
    detail = {True: "fake: it registers the RyzenAI provider", False: "fake: Unknown provider name 'RyzenAI'", None: "fake: no clear answer"}[known]
    monkeypatch.setattr(probes, "provider_known", lambda: (known, detail))
