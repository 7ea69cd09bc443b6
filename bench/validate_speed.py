"""Validate speed (issues 2 and 13), side by side in one run: whole-process `raipack validate` of the
example package (the `make demo` output), of an 8B 16K package built by raipack's fuse code at
Llama-3.1-8B's real dimensions (bench/big_package.py) and of an 8B-shaped package in AMD's layout,
each against `python -c "import onnx, jsonschema"` run in turn with it; the bytes each validation
reads, counted by the kernel (/proc/self/io); peak memory; and --verify-hashes throughput against
`openssl dgst -sha256`."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)
sys.path.append(str(ROOT / "tests"))

from factory import LLAMA_8B, make_package  # noqa: E402

PY = sys.executable
RAIPACK = str(Path(PY).with_name("raipack"))
GB = 1024**3
RUNS = 7
EXAMPLE = ROOT / "build" / "SmolLM2-135M-Instruct_rai_1.8.0_npu_16K"
TENSOR_ROLES = ("external_data", "npu_weights", "safetensors")  # files validate must never read whole
HEAD_BYTES = 64 * 1024  # what it may read of each
READS_PER_FILE = 2  # a config or plan may be read twice (parsed, and hashed against the manifest or its .state)

# A child process: a warm-up validation of a small package loads the check modules and the
# schemas, then the kernel's count of bytes read (/proc/self/io) is taken around validate(PKG).
# rchar counts every read(2) whatever the path (open, os.open, Path.read_bytes, ...); read_bytes is
# what came from the disk rather than the page cache. Pages of an mmap are not counted.
READ_COUNTER = r"""
import json, sys
from pathlib import Path
from raipack.validate import validate

def io():
    return {k: int(v) for k, v in (line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())}

validate(Path(sys.argv[2]))
before = io()
validate(Path(sys.argv[1]))
after = io()
print(json.dumps({k: after[k] - before[k] for k in ("rchar", "read_bytes", "syscr")}))
"""


def side_by_side(cmd_a: list[str], cmd_b: list[str], runs: int = RUNS) -> dict:
    """Run A and B in turn (A B A B ..., one warm-up each): wall seconds of each, A/B pair by pair,
    and A's exit codes."""
    def one(cmd):
        t = time.perf_counter()
        code = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
        return time.perf_counter() - t, code

    one(cmd_a)
    one(cmd_b)
    a, b, codes = [], [], set()
    for _ in range(runs):
        ta, code = one(cmd_a)
        a.append(ta)
        b.append(one(cmd_b)[0])
        codes.add(code)
    return {"a": a, "b": b, "ratios": [x / y for x, y in zip(a, b)], "codes": sorted(codes)}


def peak_rss_mib(cmd: list[str]) -> float:
    """The child's peak RSS (ru_maxrss), started from a small launcher: Linux carries the forking
    process's peak across exec, so a child of this (large, after fuse) process would report ours."""
    code = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL);"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([PY, "-c", code, *cmd], capture_output=True, text=True, check=True).stdout
    return int(out.strip()) / 1024


def spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.2f} s (min {min(xs):.2f}, max {max(xs):.2f})"


def bytes_read(pkg: Path, warmup: Path) -> dict:
    out = subprocess.run([PY, "-c", READ_COUNTER, str(pkg), str(warmup)], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if out.returncode:
        raise RuntimeError(f"counting the bytes validate reads of {pkg} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def sizes(pkg: Path) -> dict:
    """Apparent bytes of the package's tensor files and of its other files, and how many of each."""
    from raipack.core.package import role_of

    out = {"tensor_bytes": 0, "tensor_files": 0, "other_bytes": 0, "other_files": 0}
    for p in pkg.rglob("*"):
        if p.is_file():
            kind = "tensor" if role_of(p.relative_to(pkg).as_posix()) in TENSOR_ROLES else "other"
            out[f"{kind}_bytes"] += p.stat().st_size
            out[f"{kind}_files"] += 1
    return out


def example_package() -> Path:
    """The `make demo` output; built (from the cache where it can) when it is missing."""
    if not (EXAMPLE / "manifest.json").is_file():
        proc = subprocess.run([RAIPACK, "build", "--quiet", "--output", str(EXAMPLE.parent)], cwd=ROOT, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"raipack build of the example package failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return EXAMPLE


def validate_rows(label: str, pkg: Path, warmup: Path, note: str, ratio_goal: float | None = 3.0) -> list[dict]:
    """Whole-process validate time against the imports, its peak RSS and the bytes it reads."""
    m = side_by_side([RAIPACK, "validate", str(pkg)], [PY, "-c", "import onnx, jsonschema"])
    t, ratio = statistics.median(m["a"]), statistics.median(m["ratios"])
    ok = t < 1.0 and (ratio_goal is None or ratio <= ratio_goal) and m["codes"] == [0]
    goal = "< 1 s" + (f" and <= {ratio_goal:g}x" if ratio_goal else "") + " (medians), exit 0"
    rows = [{"name": f"validate {label} (whole process)", "value": f"{t:.2f} s", "ratio": ratio,
             "baseline": f"python -c 'import onnx, jsonschema' {spread(m['b'])}", "goal": goal, "ok": ok,
             "note": f"{spread(m['a'])}, ratio min {min(m['ratios']):.2f} max {max(m['ratios']):.2f}, {RUNS} pairs, exit {m['codes']}; {note}"}]
    rss = max(peak_rss_mib([RAIPACK, "validate", str(pkg)]) for _ in range(3))
    rows.append({"name": f"validate {label}: peak RSS", "value": f"{rss:.0f} MiB", "ratio": None, "baseline": "", "goal": "< 200 MiB",
                 "ok": rss < 200, "note": "largest ru_maxrss of 3 runs"})
    n, io = sizes(pkg), bytes_read(pkg, warmup)
    allowed = READS_PER_FILE * n["other_bytes"] + HEAD_BYTES * n["tensor_files"]
    rows.append({"name": f"validate {label}: bytes read (kernel count)", "value": f"{io['rchar'] / 1e6:.2f} MB", "ratio": io["rchar"] / max(1, n["other_bytes"]),
                 "baseline": f"its non-tensor files {n['other_bytes'] / 1e6:.2f} MB (package {(n['tensor_bytes'] + n['other_bytes']) / 1e9:.2f} GB)",
                 "goal": f"<= {READS_PER_FILE}x non-tensor files + 64 KiB per tensor file ({allowed / 1e6:.2f} MB)", "ok": io["rchar"] <= allowed,
                 "note": f"{n['tensor_files']} tensor files {n['tensor_bytes'] / 1e9:.2f} GB, {n['other_files']} other files; "
                         f"from disk (not page cache) {io['read_bytes'] / 1e6:.2f} MB, {io['syscr']} read calls"})
    return rows


def openssl_rate(path: Path) -> float:
    t = time.perf_counter()
    subprocess.run(["openssl", "dgst", "-sha256", str(path)], check=True, stdout=subprocess.DEVNULL)
    return path.stat().st_size / (time.perf_counter() - t)


def ours_rate(paths: list[Path], jobs: int) -> float:
    from raipack.core.hashing import sha256_many

    t = time.perf_counter()
    sha256_many(paths, jobs)
    return sum(p.stat().st_size for p in paths) / (time.perf_counter() - t)


def rows(tmp: Path) -> list[dict]:
    import big_package

    amd = make_package(tmp, "1.8.0-npu-16K", LLAMA_8B, sparse=True, npu_bytes=int(3.8 * GB), data_bytes=int(1.3 * GB), name="Llama-3.1-8B_rai_1.8.0_npu_16K")
    warmup = make_package(tmp / "warmup", "1.8.0-npu-16K")
    example = example_package()
    out = validate_rows("example package", example, warmup, f"{example.name}, {sum(1 for p in example.rglob('*') if p.is_file())} files")
    t = time.perf_counter()
    big, report = big_package.build(tmp / "big")
    try:
        built = time.perf_counter() - t
        note = (f"{sum(1 for p in big.rglob('*') if p.is_file())} files, {len(report['lengths']['prefill'])} prefill + {len(report['lengths']['token'])} token tiers, "
                f"built by fuse in {built:.0f} s ({report['bytes_written'] / 1e9:.1f} GB written)")
        out += validate_rows("8B 16K raipack package", big, warmup, note)
    finally:
        shutil.rmtree(tmp / "big", ignore_errors=True)
    n_bucket = len(list(amd.glob("dd_metastate_*")))
    out += validate_rows("8B-shaped AMD-layout package", amd, warmup, f"{n_bucket} metastate files, model.bin 3.8 GB sparse", ratio_goal=None)
    blob = tmp / "blob.bin"
    with open(blob, "wb") as fh:
        block = os.urandom(64 * 1024 * 1024)
        for _ in range(16):
            fh.write(block)
    openssl_rate(blob)  # warm the page cache
    ssl = max(openssl_rate(blob) for _ in range(3))
    ours = max(ours_rate([blob], 1) for _ in range(3))
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
