"""Validate speed on an 8B-shaped package (issue 2): whole-process time, bytes
read from weights files, peak memory, and --verify-hashes throughput against
`openssl dgst -sha256`, all measured side by side in one run."""

from __future__ import annotations

import builtins
import io
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "tests"))

from factory import LLAMA_8B, make_package  # noqa: E402

PY = sys.executable
GB = 1024**3


def wall(cmd, repeat=5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        best = min(best, time.perf_counter() - t)
    return best


def peak_rss_mib(cmd) -> float:
    code = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL);"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([PY, "-c", code, *cmd], capture_output=True, text=True).stdout
    return int(out.strip()) / 1024


def weights_bytes_read(pkg: Path) -> dict[str, int]:
    """Run validate in-process with open() counting bytes read from weights files."""
    from pipeline.core.package import Package
    from pipeline.validate import validate

    weights = {str(pkg / f.rel) for f in Package.scan(pkg).files.values() if f.role in ("external_data", "npu_weights", "cache_const", "metastate")}
    counts: dict[str, int] = {}
    real_open = builtins.open

    class Counting(io.BufferedReader):
        pass

    def counting_open(file, mode="r", *a, **kw):
        fh = real_open(file, mode, *a, **kw)
        if str(file) in weights and "b" in mode:
            raw_read = fh.read

            def read(n=-1):
                data = raw_read(n)
                counts[str(file)] = counts.get(str(file), 0) + len(data)
                return data

            fh.read = read
        return fh

    builtins.open = counting_open
    try:
        validate(pkg)
    finally:
        builtins.open = real_open
    return counts


def openssl_rate(path: Path) -> float:
    t = time.perf_counter()
    subprocess.run(["openssl", "dgst", "-sha256", str(path)], check=True, stdout=subprocess.DEVNULL)
    return path.stat().st_size / (time.perf_counter() - t)


def ours_rate(paths: list[Path], jobs: int) -> float:
    from pipeline.core.hashing import sha256_many

    t = time.perf_counter()
    sha256_many(paths, jobs)
    return sum(p.stat().st_size for p in paths) / (time.perf_counter() - t)


def rows(tmp: Path) -> list[dict]:
    pkg = make_package(tmp, "1.8.0-npu-16K", LLAMA_8B, sparse=True, npu_bytes=int(3.8 * GB), data_bytes=int(1.3 * GB), name="Llama-3.1-8B_rai_1.8.0_npu_16K")
    n_bucket = len(list(pkg.glob("dd_metastate_*")))
    raipack = [str(Path(PY).with_name("raipack")), "validate", str(pkg)]
    t_validate = wall(raipack)
    t_imports = wall([PY, "-c", "import onnx, jsonschema"])
    read = weights_bytes_read(pkg)
    rss = peak_rss_mib(raipack)
    out = [
        {"name": "validate 8B-shaped package (whole process)", "value": f"{t_validate:.2f} s", "ratio": t_validate / t_imports, "baseline": f"python -c 'import onnx, jsonschema' {t_imports:.2f} s", "goal": "< 1 s wall", "ok": t_validate < 1.0,
         "note": f"{sum(1 for _ in pkg.rglob('*'))} files, {n_bucket} metastate files, model.bin {3.8:.1f} GB sparse"},
        {"name": "bytes read from any weights file", "value": f"{max(read.values(), default=0)} B", "ratio": None, "baseline": "", "goal": "<= 64 KiB", "ok": max(read.values(), default=0) <= 64 * 1024, "note": ""},
        {"name": "validate peak RSS", "value": f"{rss:.0f} MiB", "ratio": None, "baseline": "", "goal": "< 200 MiB", "ok": rss < 200, "note": ""},
    ]
    big = tmp / "big.bin"
    with open(big, "wb") as fh:
        block = os.urandom(64 * 1024 * 1024)
        for _ in range(16):
            fh.write(block)
    openssl_rate(big)  # warm the page cache
    ssl = max(openssl_rate(big) for _ in range(3))
    ours = max(ours_rate([big], 1) for _ in range(3))
    out.append({"name": "--verify-hashes, one 1 GiB file", "value": f"{ours / 1e9:.2f} GB/s", "ratio": ours / ssl, "baseline": f"openssl dgst -sha256 {ssl / 1e9:.2f} GB/s", "goal": ">= 0.9x", "ok": ours / ssl >= 0.9, "note": ""})
    many = []
    for i in range(8):
        p = tmp / f"part{i}.bin"
        with open(p, "wb") as fh:
            fh.write(block)
            fh.write(block)
        many.append(p)
    ours_rate(many, 1)
    one = max(ours_rate(many, 1) for _ in range(2))
    cores = os.cpu_count() or 1
    alln = max(ours_rate(many, cores) for _ in range(2))
    out.append({"name": f"--verify-hashes, 8 files on {cores} cores", "value": f"{alln / 1e9:.2f} GB/s", "ratio": alln / one, "baseline": f"same on 1 core {one / 1e9:.2f} GB/s", "goal": f">= {0.8 * cores:.1f}x (every core)", "ok": alln / one >= 0.8 * cores, "note": ""})
    return out


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        for row in rows(Path(d)):
            print(row)
