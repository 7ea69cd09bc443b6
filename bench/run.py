"""Every speed and memory figure the issues ask for, in one table.

Each row is measured side by side with its baseline in this run and printed
with the ratio and the goal it is held to. Usage: `make bench` (or
`python bench/run.py [ROW_GROUP ...]`). Results also go to bench/out/bench.json.

Exit status: 0 every row meets its goal; 1 a row misses its goal (the rows are named); 2 a row group
failed to measure (its error is printed and recorded as a row; the other groups still run); 3 an
unknown row group was asked for. docs/measurements/bench.md says what each row measures.
"""

from __future__ import annotations

import importlib
import json
import sys
import tempfile
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

GROUPS = ["validate_speed", "fuse_speed", "stages_speed"]


def main(argv: list[str]) -> int:
    groups = argv or GROUPS
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        print(f"bench/run.py: no row group {', '.join(unknown)}; the groups are {', '.join(GROUPS)}", file=sys.stderr)
        return 3
    table = []
    for group in groups:
        for row in _measure(group):
            table.append(row)
            print(_line(row), flush=True)
    (HERE / "out").mkdir(exist_ok=True)
    (HERE / "out" / "bench.json").write_text(json.dumps(table, indent=2))
    return verdict(table)


def _measure(group: str) -> list[dict]:
    """The rows of one group, or one row saying why they could not be measured."""
    try:
        mod = importlib.import_module(group)
        with tempfile.TemporaryDirectory(prefix=f"raipack-bench-{group}-") as tmp:
            rows = list(mod.rows(Path(tmp)))
    except Exception as err:  # a failed group is reported as a row and fails the run
        traceback.print_exc(file=sys.stderr)
        return [{"group": group, "name": f"{group} (not measured)", "value": "error", "ratio": None, "baseline": "", "goal": "measured",
                 "ok": False, "error": f"{type(err).__name__}: {err}", "note": f"{type(err).__name__}: {err}"}]
    for row in rows:
        row["group"] = group
    return rows


def verdict(table: list[dict]) -> int:
    """Print which rows missed their goal or failed; the exit status (see the module docstring)."""
    errors = [r["name"] for r in table if r.get("error")]
    missed = [r["name"] for r in table if not r["ok"] and not r.get("error")]
    print(f"\n{len(table) - len(missed) - len(errors)} of {len(table)} rows meet their goal")
    if missed:
        print("missed their goal: " + "; ".join(missed))
    if errors:
        print("not measured (error): " + "; ".join(errors))
    return 2 if errors else 1 if missed else 0


def _line(row: dict) -> str:
    ratio = f"{row['ratio']:.2f}x" if row.get("ratio") is not None else "-"
    mark = "ERR " if row.get("error") else "ok  " if row["ok"] else "MISS"
    base = f" vs {row['baseline']}" if row.get("baseline") else ""
    note = f"  ({row['note']})" if row.get("note") else ""
    return f"{mark} {row['name']:48} {row['value']:>12}  ratio {ratio:>6}{base}  goal {row['goal']}{note}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
