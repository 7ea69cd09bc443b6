"""`raipack inspect`: the summary a person reads first."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from raipack.checks import run_checks
from raipack.npu.dims import model_dims
from raipack.npu.layout import metastate_sets, tiers_present
from raipack.npu.spec import Profile
from raipack.npu.target import Target
from raipack.validate import open_package


def summary(path: Path, profile: str = "auto") -> dict:
    ctx, reason = open_package(path, profile)
    findings, _ = run_checks(ctx, select=("RP1", "RP201"))
    pkg, prof = ctx.pkg, ctx.profile
    opts, _ = ctx.options
    q = ctx.quant_config or {}
    weight = (q.get("global_quant_config") or {}).get("weight") or {}
    if isinstance(weight, list):
        weight = weight[0] if weight else {}
    graph_ops = _graph_ops(ctx)
    L = ctx.settings.as_dict()
    return {
        "path": str(path),
        "profile": prof.id,
        "profile_reason": reason,
        "files": {
            "count": len(pkg.files),
            "bytes": sum(f.size for f in pkg.files.values()),
            "lfs_pointers": sorted(f.rel for f in pkg.files.values() if f.lfs),
            "largest": [{"path": f.rel, "size": f.size, "role": f.role} for f in sorted(pkg.files.values(), key=lambda f: -f.size)[:8]],
            "roles": dict(Counter(f.role for f in pkg.files.values())),
        },
        "quantization": {
            "method": q.get("quant_method"),
            "dtype": weight.get("dtype"),
            "group_size": weight.get("group_size"),
            "symmetric": weight.get("symmetric"),
            "pack_method": (q.get("export") or {}).get("pack_method"),
            "exclude": q.get("exclude"),
            "graph_ops": graph_ops,
        },
        "provider_options": opts,
        "lengths": {k: v for k, v in L.items()},
        "dims": {dim: {label: v for label, (v, _, _) in src.items()} for dim, src in model_dims(ctx.genai, ctx.model_config).items()},
        "buckets": {
            "metastate_sets": len(metastate_sets(pkg)),
            "tiers_in_files": {phase: sorted({t for ts in nodes.values() for t in ts}) for phase, nodes in tiers_present(pkg).items()} if prof.metastate.tiered else {},
            "profile_tiers": prof.buckets.as_dict(),
        },
        "runs_on": _runs_on(prof, opts),
        "findings": [f.to_dict() for f in findings],
        "advice": [f.to_dict() for f in run_checks(ctx, select=("RP0",))[0]],
        "tiers": ctx.settings.tier_rows(),
    }


def _graph_ops(ctx) -> dict:
    g = ctx.graph
    if g is None or isinstance(g, Exception):
        return {}
    return dict(Counter(f"{n.domain + '.' if n.domain else ''}{n.op_type}" for n in g.graph.node).most_common(12))


def _runs_on(prof: Profile, opts: dict) -> str:
    if prof.target is Target.INTERMEDIATE:
        return "nothing yet: an intermediate build folder, not a deployable package"
    backend = opts.get("hybrid_opt_token_backend")
    if prof.target is Target.REFERENCE:
        return "raipack's reference runtime on CPU (`raipack run`); the layout of AMD's NPU packages, not loadable by AMD's runtime"
    if backend == "npu" or prof.target is Target.NPU:
        return "prefill and decode on the NPU (RyzenAI provider); CPU for embedding and sampling"
    return "prefill on the NPU, decode on the iGPU (hybrid)"


def render(data: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.print(f"[bold]{data['path']}[/bold]")
    con.print(f"profile   {data['profile']} ({data['profile_reason']})")
    con.print(f"runs on   {data['runs_on']}")
    f = data["files"]
    con.print(f"files     {f['count']} files, {_size(f['bytes'])}" + (f", [red]{len(f['lfs_pointers'])} Git LFS pointers[/red]" if f["lfs_pointers"] else ""))
    t = Table("largest files", "size", "role", box=None, padding=(0, 2))
    for row in f["largest"]:
        t.add_row(row["path"], _size(row["size"]), row["role"])
    con.print(t)
    q = data["quantization"]
    if q["method"] or q["graph_ops"]:
        con.print(f"quant     {q['method'] or '-'} {q['dtype'] or ''} group {q['group_size']} {'symmetric' if q['symmetric'] else 'asymmetric' if q['symmetric'] is False else ''} pack {q['pack_method'] or '-'} exclude {q['exclude'] or '-'}")
        if q["graph_ops"]:
            con.print("graph     " + ", ".join(f"{k}×{v}" for k, v in q["graph_ops"].items()))
    if data["provider_options"]:
        t = Table("RyzenAI option", "value", box=None, padding=(0, 2))
        for k, v in sorted(data["provider_options"].items()):
            t.add_row(k, repr(v))
        con.print(t)
    L = data["lengths"]
    con.print("lengths   " + ", ".join(f"{k} {v}" for k, v in L.items() if v not in (None, {}, False)))
    b = data["buckets"]
    con.print(f"buckets   {b['metastate_sets']} metastate sets; tiers in files {b['tiers_in_files']}; profile tiers prefill {b['profile_tiers']['prefill']} token {len(b['profile_tiers']['token'])} tiers")
    _render_tiers(con, data["tiers"], Table)
    for x in data["advice"]:
        con.print(f"[cyan]advice[/cyan]    {x['check_id']} {x['path']}: {x['message']}", highlight=False)
        con.print(f"          hint: {x['hint']}", highlight=False)
    errors = [x for x in data["findings"] if x["severity"] == "error"]
    if errors:
        con.print(f"[red]{len(errors)} file problems[/red] (run `raipack validate` for every check)")


def _render_tiers(con, rows: list[dict], Table) -> None:
    """Which compiled tier serves each length setting, and the padding it costs."""
    if not any(r["tier"] or r["tier_below"] for r in rows):
        return
    t = Table(box=None, padding=(0, 1))
    t.add_column("setting", no_wrap=True)
    for name in ("value", "phase", "tier below", "tier", "padding"):
        t.add_column(name, no_wrap=True)
    for r in rows:
        t.add_row(r["setting"], str(r["value"]), r["phase"], str(r["tier_below"] or "-"), str(r["tier"] or "beyond the tiers"), "-" if r["padding"] is None else str(r["padding"]))
    con.print(t)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
