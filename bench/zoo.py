"""Zoo scale (issue 17), side by side in one run, as whole processes:

1. `raipack validate` of a zoo of 200 generated packages (tests/factory.py, 1.8.0 NPU 16K): serial against
   `--jobs 2` and `--executor ray` (a local Ray started and stopped by that command), run in turn
   (serial, jobs, ray, serial, jobs, ray, ...); each ratio is taken round by round against the serial run
   of that round, and the median ratio is reported.
2. A 2 x 2 batch (two tiny random Llamas x 1.8.0-npu-4K and 1.7.1-npu-4K, RTN): four `raipack build` runs one
   after the other against one `raipack batch --jobs 2` run, each from an empty cache. The builds share their
   cache as a user's successive builds would (the second profile's quantize and export are hits), so the
   ratio is what batching adds beyond the cache: two entries' stages at once.

Usage: `python bench/zoo.py [validate|batch ...]`; rows as bench/run.py prints them, and
bench/out/zoo.json. docs/measurements/zoo.md has one run's numbers.
"""

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
for p in (str(ROOT), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

PY = sys.executable
RAIPACK = str(Path(PY).with_name("raipack"))
PACKAGES = 200
ROUNDS = 3
PROFILES = ("1.8.0-npu-4K", "1.7.1-npu-4K")  # the tiny models take 512 tokens: 4K targets only


def make_zoo(root: Path, n: int = PACKAGES) -> Path:
    """n packages: one generated, then copied (each a folder of its own, as a zoo has)."""
    from factory import make_package

    zoo = root / "zoo"
    first = make_package(zoo, "1.8.0-npu-16K", name="model-000")
    for i in range(1, n):
        shutil.copytree(first, zoo / f"model-{i:03d}")
    return zoo


def timed(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> tuple[float, int]:
    start = time.perf_counter()
    code = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=cwd).returncode
    return time.perf_counter() - start, code


def validate_rows(tmp: Path) -> list[dict]:
    zoo = make_zoo(tmp)
    cmds = {"serial": [RAIPACK, "validate", str(zoo)], "--jobs 2": [RAIPACK, "validate", "--jobs", "2", str(zoo)],
            "--executor ray": [RAIPACK, "validate", "--executor", "ray", str(zoo)]}
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    for cmd in cmds.values():  # warm-up: page cache, Ray's first start
        timed(cmd, env, tmp)
    secs: dict[str, list[float]] = {k: [] for k in cmds}
    codes: set[int] = set()
    for _ in range(ROUNDS):
        for name, cmd in cmds.items():
            t, code = timed(cmd, env, tmp)
            secs[name].append(t)
            codes.add(code)
    rows = []
    for name, times in secs.items():
        ratios = [t / s for t, s in zip(times, secs["serial"])]
        rows.append({"name": f"validate {PACKAGES} packages, {name}", "value": f"{statistics.median(times):.2f} s",
                     "ratio": None if name == "serial" else round(statistics.median(ratios), 2), "baseline": "serial, same round",
                     "goal": "measured", "ok": codes == {0}, "seconds": times,
                     "note": f"{ROUNDS} rounds, median; exit codes {sorted(codes)}"})
    return rows


def tiny_models(root: Path) -> list[Path]:
    from shared_fixtures import make_tiny_llama

    return [make_tiny_llama(root / "models" / "tiny-a"), make_tiny_llama(root / "models" / "tiny-b", hidden=128, intermediate=256)]


def batch_rows(tmp: Path) -> list[dict]:
    models = tiny_models(tmp)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    serial_env = {**env, "RAIPACK_CACHE": str(tmp / "cache-serial")}
    start = time.perf_counter()
    codes = [timed([RAIPACK, "build", str(m), "--profile", p, "--algorithm", "rtn", "--quiet", "-o", str(tmp / "serial")], serial_env, tmp)[1]
             for m in models for p in PROFILES]
    serial = time.perf_counter() - start
    matrix = tmp / "matrix.toml"
    matrix.write_text('output = "zoo"\n' + f"profiles = {json.dumps(list(PROFILES))}\n" + '[recipe.quantize]\nalgorithm = "rtn"\n'
                      + "".join(f'[[models]]\nname = "{m.name}"\npath = "{m}"\n' for m in models))
    batch, code = timed([RAIPACK, "batch", str(matrix), "--jobs", "2"], {**env, "RAIPACK_CACHE": str(tmp / "cache-batch")}, tmp)
    ok = codes == [0] * 4 and code == 0
    note = f"build exit codes {codes}, batch exit code {code}"
    return [{"name": "2 x 2 tiny models, 4 builds one after another", "value": f"{serial:.1f} s", "ratio": None, "baseline": "",
             "goal": "measured", "ok": ok, "note": note},
            {"name": "2 x 2 tiny models, raipack batch --jobs 2", "value": f"{batch:.1f} s", "ratio": round(batch / serial, 2),
             "baseline": "the 4 builds", "goal": "measured", "ok": ok, "note": note}]


GROUPS = {"validate": validate_rows, "batch": batch_rows}


def rows(tmp: Path) -> list[dict]:
    """bench/run.py's interface: every row of both groups."""
    out = []
    for fn in GROUPS.values():
        sub = tmp / fn.__name__
        sub.mkdir()
        out += fn(sub)
    return out


def main(argv: list[str]) -> int:
    names = argv or list(GROUPS)
    unknown = [n for n in names if n not in GROUPS]
    if unknown:
        print(f"bench/zoo.py: no group {', '.join(unknown)}; the groups are {', '.join(GROUPS)}", file=sys.stderr)
        return 3
    table = []
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"raipack-bench-zoo-{name}-") as tmp:
            for row in GROUPS[name](Path(tmp)):
                table.append(row)
                ratio = f"  ratio {row['ratio']}" if row["ratio"] is not None else ""
                print(f"{row['name']:<50} {row['value']:>10}{ratio}  ({row['note']})", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end", flush=True)
    (HERE / "out").mkdir(exist_ok=True)
    (HERE / "out" / "zoo.json").write_text(json.dumps(table, indent=2))
    return 0 if all(r["ok"] for r in table) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
