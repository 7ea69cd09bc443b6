"""The probes of this machine that could load a library or need the system: each runs in a child process
started from an empty folder (a crash or a hang is an answer, not the end of raipack), or reads the system.

- whether the provider library loads: `ctypes.CDLL` in a child started isolated (`python -I`).
- whether onnxruntime-genai knows the RyzenAI provider: a child builds `og.Model` from a tiny
  genai_config.json whose provider block is RyzenAI, with `RYZENAI_EP_PATH` naming a file that does not
  exist in an empty folder (so nothing is loaded). "Failed to register RyzenAI execution provider
  library" means it knows the provider and loads it from a library; "Unknown provider name 'RyzenAI'"
  means it does not (the public builds before the provider went upstream, #333).
- the NPU: Linux, the `amdxdna` kernel driver (/sys/module/amdxdna) and its device nodes
  (/dev/accel/accel*); Windows, the NPU driver's version from Win32_PnPSignedDriver through PowerShell
  (no admin rights needed).
- the Ryzen AI SDK: `$RYZEN_AI_INSTALLATION_PATH`, whose last folder is the version (AMD's installer
  writes C:\\Program Files\\RyzenAI\\<version>); assumed, as no version file is documented.

Tests replace these functions (by name, on this module) to stand for machines we lack.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from raipack.npu import catalog
from raipack.npu.settings import INSTALL_ENV, installed_sdk_version
from raipack.runtime.provider import EP_ENV, LIBRARY

PROBE_TIMEOUT_S = 120
LOAD_CODE = "import ctypes, sys; ctypes.CDLL(sys.argv[1]); print('loaded')"
PROVIDER_CODE = """import sys
try:
    import onnxruntime_genai as og
except Exception as exc:
    print("raipack-probe import " + type(exc).__name__ + ": " + (str(exc).splitlines() or [""])[0], flush=True)
    sys.exit(0)
try:
    og.Model(sys.argv[1])
    print("raipack-probe loaded", flush=True)
except Exception as exc:
    print("raipack-probe error " + " ".join(str(exc).split())[:400], flush=True)
"""
TINY_CONFIG = {"model": {"type": "llama", "vocab_size": 8, "context_length": 8, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
                         "decoder": {"filename": "model.onnx", "head_size": 2, "hidden_size": 4, "num_attention_heads": 2, "num_hidden_layers": 1,
                                     "num_key_value_heads": 2, "session_options": {"provider_options": [{"RyzenAI": {}}]},
                                     "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                                                "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
                                     "outputs": {"logits": "logits", "present_key_names": "present.%d.key", "present_value_names": "present.%d.value"}}},
               "search": {"max_length": 8}}
NPU_DRIVER_PS = ("$d = Get-CimInstance Win32_PnPSignedDriver | Where-Object { $_.DeviceName -like '*NPU*' } | Select-Object -First 1; "
                 "if ($d) { $d.DriverVersion; $d.HardWareID }")
PCI_DEVICE = re.compile(r"VEN_1022&(DEV_[0-9A-F]{4})", re.IGNORECASE)


def search_path() -> list[str]:
    """sys.path without the current folder (a dist-info planted there would lie about versions)."""
    try:
        cwd = Path.cwd().resolve()
    except OSError:
        cwd = None
    return [p for p in sys.path if p and Path(p).is_absolute() and Path(p).resolve() != cwd]


def _child_env(extra: dict) -> dict:
    """The environment for a probe: PYTHONPATH keeps only absolute entries (never the current folder)."""
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.isabs(p)]
    env = {**os.environ, **extra}
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        env.pop("PYTHONPATH", None)
    return env


def _run(command: list[str], env: dict, cwd: str) -> subprocess.CompletedProcess | str:
    try:
        return subprocess.run(command, capture_output=True, text=True, errors="replace", cwd=cwd, env=env, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"did not finish within {PROBE_TIMEOUT_S} s"
    except OSError as exc:
        return f"could not be started ({exc})"


def library_loads(library: Path) -> tuple[bool, str]:
    """(True, "") if the shared library loads in an isolated child process, else (False, why in one line)."""
    with tempfile.TemporaryDirectory(prefix="raipack-doctor-") as empty:
        proc = _run([sys.executable, "-I", "-c", LOAD_CODE, str(library)], _child_env({}), empty)
    if isinstance(proc, str):
        return False, f"loading it {proc}"
    if proc.returncode == 0 and "loaded" in proc.stdout:
        return True, ""
    if proc.returncode < 0:
        return False, f"loading it crashed the process (signal {-proc.returncode})"
    last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    return False, " ".join(last.split())[:300]


def provider_known() -> tuple[bool | None, str]:
    """(True, how) if the installed onnxruntime-genai knows the RyzenAI provider, (False, why) if it
    does not or cannot be imported, (None, what it said) if its answer is neither."""
    with tempfile.TemporaryDirectory(prefix="raipack-doctor-") as empty:
        config = Path(empty) / "config"
        config.mkdir()
        (config / "genai_config.json").write_text(json.dumps(TINY_CONFIG))
        work = Path(empty) / "work"
        work.mkdir()
        env = _child_env({EP_ENV: str(work / "absent" / LIBRARY)})
        proc = _run([sys.executable, "-c", PROVIDER_CODE, str(config)], env, str(work))
    if isinstance(proc, str):
        return None, f"the probe {proc}"
    said = next((line[len("raipack-probe "):] for line in proc.stdout.splitlines() if line.startswith("raipack-probe ")), "")
    if said.startswith("import "):
        return False, f"onnxruntime-genai cannot be imported ({said[7:]})"
    if "Failed to register RyzenAI execution provider library" in said:
        return True, "it registers the RyzenAI provider from a library (RYZENAI_EP_PATH), tested with none there"
    if "Unknown provider name 'RyzenAI'" in said:
        return False, "onnxruntime-genai says: Unknown provider name 'RyzenAI'"
    if not said:
        last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return None, f"the probe ended without an answer: {' '.join(last.split())[:300]}"
    return None, f"onnxruntime-genai answered: {said[:300]}"


def npu_device(platform: str | None = None, root: Path = Path("/"), runner=subprocess.run) -> dict:
    """{"present": bool, "driver": str|None, "device": "DEV_17F0"|None, "detail": one line}: the NPU as
    this platform shows it (device: its PCI device id, vendor 0x1022, as AMD's npu_check reads it).
    `root` and `runner` are where tests put a fake system."""
    platform = platform or sys.platform
    if platform.startswith("linux"):
        module = root / "sys" / "module" / "amdxdna"
        nodes = sorted(str(p.relative_to(root).as_posix()) for p in (root / "dev" / "accel").glob("accel*")) if (root / "dev" / "accel").is_dir() else []
        version = module / "version"
        driver = version.read_text().strip() if version.is_file() else ("loaded" if module.is_dir() else None)
        device = _linux_pci_device(root)
        parts = [f"amdxdna driver {'loaded' if module.is_dir() else 'not loaded'} (/sys/module/amdxdna)",
                 f"device nodes {', '.join('/' + n for n in nodes)}" if nodes else "no /dev/accel/accel* device node"]
        parts += [f"PCI device {device}"] if device else []
        return {"present": module.is_dir() and bool(nodes), "driver": driver, "device": device, "detail": "; ".join(parts)}
    if platform.startswith("win"):
        try:
            proc = runner(["powershell", "-NoProfile", "-NonInteractive", "-Command", NPU_DRIVER_PS], capture_output=True, text=True, timeout=60)
            lines = [line.strip() for line in proc.stdout.splitlines() if line.strip()] if proc.returncode == 0 else []
        except (OSError, subprocess.TimeoutExpired) as exc:
            return {"present": False, "driver": None, "device": None, "detail": f"the NPU driver could not be queried ({exc})"}
        if lines:
            device = next((m[1].upper() for m in map(PCI_DEVICE.search, lines[1:]) if m), None)
            return {"present": True, "driver": lines[0], "device": device,
                    "detail": f"NPU driver {lines[0]}" + (f", PCI device {device}" if device else "") + " (Win32_PnPSignedDriver)"}
        return {"present": False, "driver": None, "device": None, "detail": "no device named *NPU* among the signed drivers (Win32_PnPSignedDriver)"}
    return {"present": False, "driver": None, "device": None, "detail": f"Ryzen AI NPUs run on Windows and Linux; this is {platform}"}


def _linux_pci_device(root: Path) -> str | None:
    """The PCI device id (DEV_xxxx) of the first AMD device the release catalog lists as an NPU."""
    known = {k for k in catalog.load()["devices"] if k.startswith("DEV_")}
    folder = root / "sys" / "bus" / "pci" / "devices"
    for dev in sorted(folder.iterdir()) if folder.is_dir() else ():
        try:
            vendor, device = ((dev / n).read_text().strip().lower() for n in ("vendor", "device"))
        except OSError:
            continue
        name = "DEV_" + device.removeprefix("0x").upper()
        if vendor == "0x1022" and name in known:
            return name
    return None


def sdk_install() -> dict:
    """{"path", "version"} of the Ryzen AI install $RYZEN_AI_INSTALLATION_PATH names (both None without one)."""
    path = os.environ.get(INSTALL_ENV, "")
    return {"path": path or None, "exists": bool(path) and Path(path).is_dir(), "version": installed_sdk_version(path) if path else None}
