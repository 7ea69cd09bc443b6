"""The accuracy chain: the same tasks on every stage a build produced, the drop stage by stage, and
the build gate (a recipe's `[eval]` table: a drop over `max_drop` fails the build). With
`numerics = "bfp16"` — the default for a package of an NPU or hybrid target (targets.device_numerics) — the
package is scored a second time under BFP16 activations, a row of its own (`fuse (bfp16)`) that the gate holds
to `max_drop` like every other.

Stage outputs are found through `<package>.stages/<stage>` links beside the package, then through
the lineage every raipack manifest records (each stage's inputs and their paths), so a package
whose links are gone still leads to its export, its Quark folder and its source model.

A drop is in the metric's own units, measured so that worse is positive: `source - value` for a
metric lm-eval says is higher-is-better (acc), `value - source` for the others (perplexity).
"""

from __future__ import annotations

import json
from pathlib import Path

from raipack.core import manifest
from raipack.core.errors import RaipackError, UsageError
from raipack.core.output import atomic_write_text
from raipack.data import load_data
from raipack.evaluation.run import Request, drops, session
from raipack.evaluation.targets import detect_target, device_numerics


class GateFailed(RaipackError):
    """The accuracy gate refused the build: a drop over max_drop."""


def _package_and_links(build_dir: Path) -> tuple[Path | None, Path | None]:
    """(the package, its `.stages` links folder) for a build's output folder or a package."""
    build_dir = Path(build_dir).resolve()
    if not build_dir.is_dir():
        raise UsageError(f"{build_dir} is not a folder", "give a build's output folder or the package it wrote")
    if (build_dir / "genai_config.json").is_file():
        links = build_dir.parent / f"{build_dir.name}.stages"
        return build_dir, links if links.is_dir() else None
    found = sorted(p for p in build_dir.glob("*.stages") if p.is_dir())
    if len(found) != 1:
        what = "no <package>.stages folder" if not found else f"{len(found)} packages ({', '.join(p.name[:-7] for p in found)})"
        raise UsageError(f"{build_dir} holds {what}", "give the package folder itself, or the output folder of one build")
    pkg = build_dir / found[0].name[: -len(".stages")]
    return (pkg if pkg.is_dir() else None), found[0]


def stage_outputs(build_dir: Path) -> dict[str, Path]:
    """stage name -> output folder, for every stage raipack eval runs on; the package stands for its fuse stage."""
    pkg, links = _package_and_links(build_dir)
    outputs: dict[str, Path] = {}
    if links is not None:
        outputs.update({p.name: p.resolve() for p in links.iterdir() if p.is_dir() and not p.name.startswith(".")})
    todo = [pkg] if pkg else []
    todo += list(outputs.values())
    seen: set[Path] = set()
    while todo:  # the lineage: each manifest names its inputs' folders
        folder = todo.pop()
        if folder in seen:
            continue
        seen.add(folder)
        for inp in ((manifest.read(folder) or {}).get("lineage") or {}).get("inputs", []):
            path = Path(str(inp.get("path", "")))
            if inp.get("stage") and inp["stage"] not in outputs and path.is_dir():
                outputs[inp["stage"]] = path
                todo.append(path)
    return in_order(outputs, pkg)


def in_order(outputs: dict[str, Path], pkg: Path | None = None) -> dict[str, Path]:
    """The outputs raipack eval runs on, in the build's stage order (a report such as smoke's left out)."""
    chain: dict[str, Path] = {}
    for name in load_data("stages.json")["order"]:
        path = outputs.get(name)
        if path is None:
            continue
        try:
            kind = detect_target(path).kind
        except UsageError:  # a report (smoke), not a model
            continue
        chain[name] = pkg if kind == "package" and pkg is not None else path
    if len(chain) < 2:
        raise UsageError(f"found {len(chain)} stage output(s) to evaluate ({', '.join(chain) or 'none'})",
                         "give the output folder of a complete build, whose <package>.stages links or manifests name its stages")
    return chain


def run_chain(outputs: dict[str, Path], req: Request, lms: dict | None = None) -> dict:
    """lm-eval on every stage output in order; {"raipack": {"chain": [...]}} (common16 format)."""
    rows = []
    with session(req) as s:
        for stage, path in outputs.items():
            target = detect_target(path)
            res = s.run(target, lm=(lms or {}).get(stage))
            rows.append({"stage": stage, "kind": target.kind, "target": str(path), "ran_on": res["raipack"]["ran_on"], "results": res})
            numerics = (req.numerics or device_numerics(path)[0]) if target.kind == "package" else "float"  # unset: the device's
            if numerics != "float":  # the same package under the NPU's numerics: the chain's last link
                label = f"{stage} ({numerics})"
                res = s.run(target, lm=(lms or {}).get(label), numerics=numerics)
                rows.append({"stage": label, "kind": target.kind, "target": str(path), "ran_on": res["raipack"]["ran_on"], "results": res})
    rows = drops(rows)
    first = rows[0]["results"]
    doc = {k: v for k, v in first.items() if k != "raipack"}  # lm-eval's format, the first stage's run
    doc["results"] = {f"{r['stage']}/{t}": v for r in rows for t, v in r["results"]["results"].items()}
    doc["raipack"] = {"chain": [{"stage": r["stage"], "kind": r["kind"], "target": r["target"], "ran_on": r["ran_on"],
                                 "results": r["results"]["results"], "drop": r["drop"]} for r in rows]}
    return doc


def chain_table(doc: dict) -> str:
    lines = [f"{'stage':<14} {'kind':<8} {'task':<20} {'metric':<18} {'value':>9} {'drop/source':>12} {'drop/prev':>10}"]
    for row in doc["raipack"]["chain"]:
        for task, metrics in sorted(row["drop"].items()):
            for key, d in metrics.items():
                lines.append(f"{row['stage']:<14} {row['kind']:<8} {task:<20} {key.split(',')[0]:<18} {d['value']:>9.4f} {d['vs_source']:>12.4f} {d['vs_previous']:>10.4f}")
    return "\n".join(lines)


def gate_problem(doc: dict, max_drop: float) -> str:
    """One sentence for the largest drop over `max_drop` (vs the source), or ""."""
    worst = None
    for row in doc["raipack"]["chain"]:
        for task, metrics in row["drop"].items():
            for key, d in metrics.items():
                if d["vs_source"] > max_drop and (worst is None or d["vs_source"] > worst[0]):
                    worst = (d["vs_source"], task, key.split(",")[0], row["stage"])
    if worst is None:
        return ""
    drop, task, metric, stage = worst
    return f"accuracy gate: {task} {metric} drops by {drop:.4f} from the source to the {stage} stage, over max_drop {max_drop}"


def preflight(req: Request) -> None:
    """The gate's tasks, checked before a build spends minutes: the task folder's format, the names."""
    with session(req):
        pass


def gate(req: Request, max_drop: float, outputs: dict[str, Path], keep: Path, progress=None) -> dict:
    """The build gate: the chain over this build's stage outputs; GateFailed over max_drop (the
    results then kept as `keep`/eval.json), else the chain's document with the gate's verdict."""
    doc = run_chain(in_order(outputs), req)
    problem = gate_problem(doc, max_drop)
    doc["raipack"]["gate"] = {"max_drop": max_drop, "passed": not problem}
    if progress is not None:
        for line in chain_table(doc).splitlines():
            progress.line(line)
    if problem:
        keep.mkdir(parents=True, exist_ok=True)
        atomic_write_text(keep / "eval.json", json.dumps(doc, indent=2) + "\n")
        raise GateFailed(problem, f"the package was not assembled; the results are in {keep / 'eval.json'}; raise [eval] max_drop or change the quantization")
    return doc
