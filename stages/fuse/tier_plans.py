"""The reference fuse backend's tier plans: one schedule per phase that every tier shares
(cache/decoder_<phase>.schedule.json) and one small dd_metastate_* plan and state per tier
(pipeline/npu/plans.py, docs/formats.md)."""

from __future__ import annotations

import json
from pathlib import Path

from raipack.core.errors import RaipackError
from raipack.npu import formats, plans
from raipack.npu.settings import NpuSettings
from raipack.stages.fuse.fuse_run import NODE, FuseRun


def _token_window(token_tiers: list[int], end: int) -> int:
    return next(t for t in token_tiers if t >= end)


def phases(S: NpuSettings) -> list[str]:
    """The phases with compiled tiers, each with its shared schedule and plans (none in a tierless
    hybrid layout, whose decode runs on the iGPU)."""
    return [phase for phase, tiers in (("prefill", S.prefill), ("token", S.token)) if tiers]


def _tier_jobs(S: NpuSettings) -> dict:
    """phase -> [(tier, sequence length, KV window)] of every plan."""
    return {"prefill": [(t, t, _token_window(S.token, t)) for t in S.prefill], "token": [(t, 1, t) for t in S.token]}


def tier_plans(run: FuseRun, schedules: dict) -> list[tuple[str, int, bytes]]:
    """(phase, tier, plan bytes) of every tier, each checked against its phase's shared schedule
    (cache/decoder_<phase>.schedule.json; pipeline/npu/plans.py)."""
    out = []
    for phase, tiers in _tier_jobs(run.settings).items():
        if not tiers:
            continue
        sched, ref = schedules[phase]
        target = plans.PlanTarget(run.settings.max_length, run.dims, _plan_io(run))
        for tier, seq, window in tiers:
            plan = plans.tier_plan(sched, ref, target, tier=tier, seq=seq, window=window)
            problems = plans.plan_problems(plan, sched, phase=phase, tier=tier)
            if problems:
                raise RaipackError(f"the {phase} plan of tier {tier} is inconsistent: {problems[0][1]}", plans.BUG)
            out.append((phase, tier, (json.dumps(plan, separators=(",", ":")) + "\n").encode("utf-8")))
    return out


def write_plans(run: FuseRun, stage: Path, planned: list[tuple[str, int, bytes]]) -> None:
    """One small dd_metastate_* plan and its state per tier; the state records the sha256 of the plan,
    the header and the graph."""
    for done, (phase, tier, plan_bytes) in enumerate(planned, start=1):
        stem = formats.metastate_stem(phase, NODE, tier)
        (stage / f"{stem}.plan").write_bytes(plan_bytes)
        state = formats.encode_state({"format": "raipack-metastate-state", "format_version": 1, "phase": phase, "tier": tier, "node": NODE,
                                      "plan_sha256": formats.sha256_hex(plan_bytes), "header_sha256": run.header_sha, "graph_sha256": run.graph_sha})
        (stage / f"{stem}.state").write_bytes(state)
        run.written[f"{stem}.plan"] = len(plan_bytes)
        run.written[f"{stem}.state"] = len(state)
        run.report("plans", done, len(planned))


def _plan_io(run: FuseRun) -> dict:
    return {k: run.fg.io[k] for k in ("input_ids", "attention_mask", "logits")}


def write_schedule(run: FuseRun, stage: Path, phase: str):
    """The schedule every tier of `phase` shares; returns it prepared and {file, sha256} for the plans."""
    # late: fuse.graph loads onnx and numpy, only when a schedule is written
    from raipack.stages.fuse.graph import ShapeError, static_schedule

    fg, kvh, hs = run.fg, run.dims["kv_heads"], run.dims["head_size"]
    weights = {t.name for t in fg.model.graph.initializer}
    probes = []
    for seq, window in plans.PROBES[phase]:
        feeds = {fg.io["input_ids"]: ("int64", [1, seq]), fg.io["attention_mask"]: ("int64", [1, window])}
        for pair in fg.io["past"]:
            for n in pair:
                feeds[n] = ("float32", [1, kvh, window, hs])
        try:
            probes.append(((seq, window), *static_schedule(fg.model, feeds)))
        except ShapeError as err:
            raise RaipackError(f"cannot plan the {phase} phase: {err}", "the graph has an operator the plan builder does not know; please report it") from None
    try:
        doc = plans.derive_schedule(phase=phase, node=NODE, probes=probes, io=fg.io, weights=weights)
    except formats.FormatError as err:
        raise RaipackError(f"cannot share the {phase} schedule between tiers: {err}", err.hint) from None
    problems = plans.schedule_problems(doc, phase=phase, node=NODE)
    if problems:
        raise RaipackError(f"the {phase} schedule is inconsistent: {problems[0][1]}", plans.BUG)
    rel = plans.schedule_rel(NODE, phase)
    data = (json.dumps(doc, indent=1) + "\n").encode("utf-8")
    (stage / rel).parent.mkdir(exist_ok=True)
    (stage / rel).write_bytes(data)
    run.written[rel] = len(data)
    return plans.Schedule(doc), {"file": rel, "sha256": formats.sha256_hex(data)}

