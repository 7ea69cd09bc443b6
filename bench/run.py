"""Every speed and memory figure the issues ask for, in one table.

Each row is measured side by side with its baseline in this run and printed
with the ratio and the goal it is held to. Usage: `make bench` (or
`python bench/run.py [ROW_GROUP ...]`). Results also go to bench/out/bench.json.
"""

from __future__ import annotations

import importlib
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

GROUPS = ["validate_speed", "fuse_speed", "stages_speed"]


def main(argv: list[str]) -> int:
    groups = argv or GROUPS
    table = []
    for group in groups:
        mod = importlib.import_module(group)
        with tempfile.TemporaryDirectory(prefix=f"raipack-bench-{group}-") as tmp:
            for row in mod.rows(Path(tmp)):
                row["group"] = group
                table.append(row)
                print(_line(row), flush=True)
    (HERE / "out").mkdir(exist_ok=True)
    (HERE / "out" / "bench.json").write_text(json.dumps(table, indent=2))
    missed = [r["name"] for r in table if not r["ok"]]
    print(f"\n{len(table) - len(missed)} of {len(table)} rows meet their goal" + (f"; missed: {', '.join(missed)}" if missed else ""))
    return 0


def _line(row: dict) -> str:
    ratio = f"{row['ratio']:.2f}x" if row.get("ratio") is not None else "-"
    mark = "ok  " if row["ok"] else "MISS"
    base = f" vs {row['baseline']}" if row.get("baseline") else ""
    note = f"  ({row['note']})" if row.get("note") else ""
    return f"{mark} {row['name']:48} {row['value']:>12}  ratio {ratio:>6}{base}  goal {row['goal']}{note}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
