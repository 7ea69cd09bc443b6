"""What the reference runtime (pipeline/runtime/reference.py) checks in a package's files while it
loads them, before onnxruntime reads anything: the header's fields, the graph's external data, and
every tier's plan with its .state and its phase's shared schedule (pipeline/npu/plans.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from raipack.npu import formats, plans
from raipack.npu.formats import FormatError
from raipack.runtime.trust import JSON_MAX_BYTES, PackageError, PackageFiles


@dataclass(frozen=True)
class PlanContext:
    """What every plan of a package is checked against: the files, the plans' node, the KV buffer's
    length, the sha256 of the header and of the graph, and the model's dimensions."""

    files: PackageFiles
    node: str
    max_length: int
    header_sha: str
    graph_sha: str
    model_dims: dict


def check_external_data(files: PackageFiles, model, graph_path: Path, weights_name: str) -> None:
    """Every tensor of the graph kept in a file other than `weights_name` (handed over from
    model.bin already) names a file of the package and lies within it, before onnxruntime opens it."""
    for t in _tensors(model.graph):
        if t.data_location != 1:  # onnx.TensorProto.EXTERNAL
            continue
        ext = {e.key: e.value for e in t.external_data}
        if ext.get("location") == weights_name:
            continue
        source = f"{graph_path.name} (external data of tensor {t.name!r})"
        rel = files.name(ext.get("location"), source)
        offset, length = offset_length(ext, source)
        size = files.size(rel)
        if offset < 0 or (length is not None and (length < 0 or offset + length > size)) or offset > size:
            raise PackageError(f"{files.root / rel} is {size} bytes, but tensor {t.name!r} of {graph_path.name} lies at bytes {offset}..{offset + (length or 0)}: the file is truncated or from another build",
                               "rebuild the package, or copy it again")


def load_schedule(files: PackageFiles, node: str, phase: str) -> tuple[str, str, plans.Schedule]:
    """(file name, sha256, prepared schedule) of the schedule every plan of `phase` shares."""
    rel = plans.schedule_rel(node, phase)
    if rel not in files.scan.files:
        raise PackageError(f"{rel} is missing: the {phase} plans share its schedule, so the package cannot run", "copy the whole cache folder, or rebuild the package")
    data = files.read(rel, "the plan format", JSON_MAX_BYTES, "metastate schedule")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as err:
        raise PackageError(f"{rel} is not valid JSON ({err})", "rebuild the package") from None
    problems = plans.schedule_problems(doc, phase=phase, node=node) if isinstance(doc, dict) else [("", "the document is not a JSON object")]
    if problems:
        raise PackageError(f"{rel} is inconsistent: {problems[0][1]}", "rebuild the package")
    return rel, formats.sha256_hex(data), plans.Schedule(doc)


def load_plan(ctx: PlanContext, phase: str, tier: int, schedule) -> dict:
    """The plan of one tier, its .state and its phase's schedule (`schedule(phase)`: load_schedule, read once) checked against
    each other, the header, the graph and the model."""
    files, model_dims = ctx.files, ctx.model_dims
    stem = formats.metastate_stem(phase, ctx.node, tier)
    plan_path, state_path = files.root / f"{stem}.plan", files.root / f"{stem}.state"
    for p in (plan_path, state_path):
        if p.name not in files.scan.files:
            raise PackageError(f"{p.name} is missing: the {phase} tier {tier} has no plan, so the package cannot run at that length", "rebuild the package; every tier needs its dd_metastate set")
    plan_bytes = files.read(plan_path.name, "the tier list of model.pb.bin", JSON_MAX_BYTES, "metastate plan")
    try:
        state = formats.decode_state(files.read(state_path.name, "the tier list of model.pb.bin", JSON_MAX_BYTES, "metastate state"), state_path.name)
    except FormatError as err:
        raise PackageError(str(err), err.hint) from None
    if state.get("plan_sha256") != formats.sha256_hex(plan_bytes):
        raise PackageError(f"{plan_path.name} does not match the sha256 its .state records (the plan was edited or swapped)", "rebuild the package")
    if state.get("header_sha256") != ctx.header_sha or state.get("graph_sha256") != ctx.graph_sha:
        raise PackageError(f"{state_path.name} was written for another model.pb.bin or model.onnx", "rebuild the package; files from different builds were mixed")
    try:
        plan = json.loads(plan_bytes)
    except (ValueError, RecursionError) as err:
        raise PackageError(f"{plan_path.name} is not valid JSON ({err})", "rebuild the package") from None
    if (why := plans.version_problem(plan)) is not None:
        raise PackageError(f"{plan_path.name} {why}", plans.VERSION_HINT)
    rel, sha, sched = schedule(phase)
    ref = plan.get("schedule") if isinstance(plan, dict) else None
    if not isinstance(ref, dict) or ref.get("file") != rel or ref.get("sha256") != sha:
        raise PackageError(f"{plan_path.name} does not name {rel} with its sha256 (the schedule was edited, swapped or comes from another build)", "rebuild the package")
    problems = plans.plan_problems(plan, sched, phase=phase, tier=tier, model=model_dims, max_length=ctx.max_length)
    if problems:
        raise PackageError(f"{plan_path.name} is inconsistent: {problems[0][1]}", "rebuild the package")
    plan["kv_cache"]["bindings"] = plans.kv_bindings(plan, sched)
    return plan


def _tensors(graph):
    """Every TensorProto of an ONNX graph: initializers and node attributes, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _tensors(g)


def offset_length(ext: dict, source: str) -> tuple[int, int | None]:
    """(offset, length or None) of an external data entry; PackageError when they are not whole numbers."""
    try:
        return int(ext.get("offset", 0)), (int(ext["length"]) if "length" in ext else None)
    except ValueError:
        raise PackageError(f"{source} has offset {ext.get('offset')!r} and length {ext.get('length')!r}; expected whole numbers", "rebuild the package") from None


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_header_fields(header: dict, path: Path) -> None:
    """The header fields the runtime reads: model dimensions and tiers, as positive integers."""
    dims, tiers = header.get("model"), header.get("tiers")
    ok = (isinstance(dims, dict) and all(_count(dims.get(k)) for k in ("layers", "kv_heads", "head_size", "vocab_size"))
          and isinstance(tiers, dict) and isinstance(tiers.get("node"), str) and _count(tiers.get("max_length"))
          and all(isinstance(tiers.get(k), list) and all(_count(t) for t in tiers[k]) for k in ("prefill", "token"))
          and bool(tiers["prefill"]) == bool(tiers["token"]))  # both, or neither (hybrid)
    if not ok:
        raise PackageError(f"{path} does not give the model's dimensions (model.layers, kv_heads, head_size, vocab_size) and tiers (tiers.prefill, token, node, max_length) as positive integers",
                           "rebuild the package")
