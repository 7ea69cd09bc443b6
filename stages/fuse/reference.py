"""The `reference` fuse backend: an onnxruntime-genai int4 export → a folder with the layout of AMD's
1.8 NPU packages, in raipack's open formats (docs/formats.md).

`fuse(export_dir, out_dir, profile)` reads the export's graph without its weights, rewrites it
(stages/fuse/graph/), checks the NPU constraints the profile knows before writing anything, then
writes into `out_dir` (new or empty: raipack.core.output.output_folder; the build runner stages and swaps):

    model.onnx         the fused graph: nodes of domain ai.raipack with their local functions
    model.onnx.data    CPU-side tensors (embedding, final norm, a float lm_head)
    model.bin          NPU-side tensors of the fused nodes, 4 KiB aligned
    model.pb.bin       the header indexing model.bin
    cache/             <node>_meta.json + <node>.const per fused node
    cache/decoder_{prefill|token}.schedule.json                what every tier of a phase shares
    dd_metastate_Llm_{Prefill|Token}_decoder_<L>.{plan,state}   one set per tier ≤ max_length
    genai_config.json, rai_config.json, config.json, tokenizer files, generation_config.json, README.md

Tiers, lengths, options and constraints all come from the profile; nothing here is a tier constant.
The weights are never loaded into Python objects: the source `model.onnx.data` is memory-mapped and
slices of it are written out while a thread pool hashes them.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from raipack.core.errors import RaipackError
from raipack.core.findings import Finding
from raipack.core.hashing import sha256_file
from raipack.core.output import output_folder
from raipack.npu import formats, plans
from raipack.npu import profile as profiles
from raipack.npu.formats import ALIGNMENT
from raipack.npu.layout import package_files
from raipack.npu.settings import NpuSettings, is_power_of_two
from raipack.npu.spec import Profile
from raipack.runtime.prompts import defaults, write_prompts_file

NODE = "decoder"  # the <node> of the dd_metastate file names: one plan covers the whole decoder
CONFIG_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
                "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json", "generation_config.json",
                "LICENSE", "LICENSE.txt", "LICENSE.md", "USE_POLICY.md", "NOTICE")
SAMPLING_KEYS = ("do_sample", "temperature", "top_p", "top_k", "repetition_penalty")


def lengths_for(profile: Profile, context_length: int | None) -> NpuSettings:
    """The NPU settings of a package built for `profile` from a model of `context_length` positions
    (pipeline/npu/settings.py: the same model the checks and the runtime read)."""
    return NpuSettings.from_profile(profile, context_length)  # SettingsError (a RaipackError) names the profile and the tier


def _token_window(token_tiers: list[int], end: int) -> int:
    return next(t for t in token_tiers if t >= end)


class _Source:
    """The export's initializers, read straight from their external data files (memory-mapped)."""

    def __init__(self, folder: Path, model):
        self.folder = folder
        self.maps: dict[str, mmap.mmap] = {}
        self.files: dict[str, object] = {}
        self.tensors = {t.name: t for t in model.graph.initializer}

    def span(self, name: str) -> tuple[int, int] | None:
        """(fd, offset) of an external initializer in its data file (call view() first), else None."""
        t = self.tensors[name]
        if t.data_location != 1:
            return None
        ext = {e.key: e.value for e in t.external_data}
        return self.files[ext["location"]].fileno(), int(ext.get("offset", 0))

    def view(self, name: str) -> memoryview:
        t = self.tensors[name]
        if t.data_location != 1:  # inline
            if t.raw_data:
                return memoryview(t.raw_data)
            from onnx import numpy_helper

            return memoryview(numpy_helper.to_array(t).tobytes())
        ext = {e.key: e.value for e in t.external_data}
        loc = ext["location"]
        if loc not in self.maps:
            path = (self.folder / loc).resolve()
            if self.folder.resolve() not in path.parents:
                raise RaipackError(f"initializer {name} points at {loc}, outside the export folder", "re-run the export stage")
            self.files[loc] = fh = open(path, "rb")
            self.maps[loc] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        off = int(ext.get("offset", 0))
        length = int(ext["length"]) if "length" in ext else formats.nbytes(formats.ONNX_DTYPE[t.data_type], t.dims)
        mm = self.maps[loc]
        if off + length > len(mm):
            raise RaipackError(f"initializer {name} ends at byte {off + length} of {loc}, which is {len(mm)} bytes", "re-run the export stage; its data file is truncated")
        return memoryview(mm)[off: off + length]

    def close(self):
        for mm in self.maps.values():
            try:
                mm.close()
            except BufferError:
                pass
        for fh in self.files.values():
            fh.close()


def _external(t, location: str, offset: int, length: int, dims=None):
    from onnx import TensorProto

    t.ClearField("raw_data")
    for name in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
        t.ClearField(name)
    if dims is not None:
        del t.dims[:]
        t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v


def _json(path: Path, doc) -> int:
    data = (json.dumps(doc, indent=2) + "\n").encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return len(data)


@dataclass
class _Run:
    """One fuse run: its inputs, the NPU settings it writes, the fused graph and what it wrote."""

    export_dir: Path
    quark_dir: Path | None
    profile: Profile
    genai: dict
    model: object  # the export's ModelProto, without its weights
    settings: NpuSettings
    fg: object = None  # raipack.stages.fuse.graph.FuseGraphResult
    model_config: dict = field(default_factory=dict)
    findings: list = field(default_factory=list)
    report: Callable = lambda what, done, total: None
    written: dict = field(default_factory=dict)
    dims: dict = field(default_factory=dict)
    header_sha: str = ""
    graph_sha: str = ""
    names: dict = field(default_factory=dict)  # graph, data, header, weights: the profile's file names

    @property
    def L(self) -> dict:
        return self.settings.report()


def fuse(export_dir: Path, out_dir: Path, profile: Profile, *, quark_dir: Path | None = None, progress=None) -> dict:
    """Fuse an OGA int4 export into a reference package in `out_dir` (new or empty). Returns the
    report: fused nodes, bytes written, constraint findings (dicts like validator findings), seconds."""
    t0 = time.perf_counter()
    export_dir, out_dir = Path(export_dir).resolve(), Path(out_dir).resolve()
    run = _prepare(export_dir, Path(quark_dir).resolve() if quark_dir else None, profile, progress)
    with closing(_Source(export_dir, run.model)) as src, output_folder(out_dir) as stage, ThreadPoolExecutor(1) as pool:
        # the schedules read the graph before the weights step rewrites its initializers; the tiers'
        # plans (pure Python) are then made on a thread while the kernel copies the weights
        schedules = {phase: _write_schedule(run, stage, phase) for phase in _phases(run.settings)}
        planned = pool.submit(_tier_plans, run, schedules)
        entries = _write_weights(run, src, stage)
        operators = _write_header(run, entries, stage)
        _write_cache(run, operators, stage)
        _write_plans(run, stage, planned.result())
        _write_configs(run, stage)
    return _fuse_report(run, t0)


def _prepare(export_dir: Path, quark_dir: Path | None, profile: Profile, progress) -> _Run:
    """Read the export, settle the NPU settings, fuse the graph and find the Quark config.json:
    everything that can refuse, before anything is written."""
    import onnx

    try:
        genai = json.loads((export_dir / "genai_config.json").read_text("utf-8"))
    except FileNotFoundError:
        raise RaipackError(f"{export_dir / 'genai_config.json'}: not found; the fuse stage reads an onnxruntime-genai export folder", "run the export stage first") from None
    graph_name = genai["model"]["decoder"].get("filename", "model.onnx")
    model = onnx.load(str(export_dir / graph_name), load_external_data=False)
    context = int(genai["model"].get("context_length") or 0) or None
    profile = profiles.for_model(profile, genai["model"].get("type"))
    run = _Run(export_dir, quark_dir, profile, genai, model, lengths_for(profile, context), report=progress or (lambda what, done, total: None),
               names=package_files(profile))
    npu_seq = run.settings.npu_seq
    if not is_power_of_two(npu_seq):
        run.findings.append(Finding("fuse-lengths", "error", "genai_config.json", f"the largest prefill tier {npu_seq} is not a power of two, but hybrid_opt_max_seq_length must be",
                                    "make the profile's largest prefill tier a power of two", "/model/decoder/session_options"))
    from raipack.stages.fuse.graph import Constraints, fuse_graph

    try:
        run.fg = fuse_graph(model, genai, Constraints.from_profile(profile))
    except ValueError as err:
        raise RaipackError(f"{export_dir / graph_name}: {err}", "fuse reads graphs written by the onnxruntime-genai model builder (int4, cpu)") from None
    run.findings += run.fg.findings
    run.report("graph", 1, 1)
    dec, m = genai["model"]["decoder"], genai["model"]
    run.dims = {"layers": int(dec["num_hidden_layers"]), "num_heads": int(dec["num_attention_heads"]), "kv_heads": int(dec["num_key_value_heads"]),
                "head_size": int(dec["head_size"]), "hidden_size": int(dec["hidden_size"]), "vocab_size": int(m["vocab_size"])}
    _read_model_config(run)
    return run


def _read_model_config(run: _Run) -> None:
    """The Quark config.json the package keeps (with its quantization_config)."""
    config_src = next((d / "config.json" for d in (run.quark_dir, run.export_dir) if d and (d / "config.json").is_file()), None)
    if config_src is None:
        raise RaipackError(f"no config.json in {run.quark_dir or run.export_dir}: the package keeps the Quark config.json with its quantization_config",
                        "pass quark_dir (the quantize stage's output folder)")
    run.model_config = json.loads(config_src.read_text("utf-8"))
    if (run.model_config.get("quantization_config") or {}).get("quant_method") != "quark" and run.profile.quantization.config_json == "quark":
        run.findings.append(Finding("fuse-config", "error", "config.json", f"{config_src} has no Quark quantization_config; profile {run.profile.id} packages keep it",
                                    "pass the Quark export folder as quark_dir", "/quantization_config"))


def _write_weights(run: _Run, src: _Source, stage: Path) -> dict:
    """model.bin (NPU-side tensors in fused-node order), model.onnx.data (CPU-side tensors) and the
    graph pointing into them; returns model.bin's entries."""
    import onnx

    fg, max_length = run.fg, run.settings.max_length
    inits = {t.name: t for t in fg.model.graph.initializer}
    npu = set(fg.npu_initializers)
    names = run.names
    writer = formats.WeightsWriter(stage / names["weights"], ALIGNMENT)
    try:
        for k, f in enumerate(fg.fused):
            for role, name in f.weights:
                if name not in npu or name in writer.entries:
                    continue
                t = inits[name]
                dims = list(t.dims)
                view = src.view(name)
                if role.endswith((".cos_cache", ".sin_cache")) and dims and dims[0] > max_length:
                    row = len(view) // dims[0]
                    dims[0] = max_length
                    view = view[: row * dims[0]]
                writer.add(name, view, formats.ONNX_DTYPE[t.data_type], dims, source=src.span(name))
            run.report("model.bin", k + 1, len(fg.fused))
        run.written[names["weights"]] = writer.close()
    except BaseException:
        writer.abort()
        raise
    for name, e in writer.entries.items():
        _external(inits[name], names["weights"], e["offset"], e["size"], e["shape"])
    run.written[names["data"]] = _write_cpu_data(fg.cpu_initializers, inits, src, stage / names["data"])
    onnx.save_model(fg.model, str(stage / names["graph"]))
    run.written[names["graph"]] = (stage / names["graph"]).stat().st_size
    run.report("weights", 1, 1)
    return writer.entries


def _write_cpu_data(names, inits: dict, src: _Source, path: Path) -> int:
    """The CPU-side tensors, aligned (the gaps are holes, read as zero bytes), into `path`; their
    initializers point there. Returns its size."""
    pos = 0
    with open(path, "wb", buffering=0) as fh:
        for name in names:
            view = src.view(name)
            start = formats.align(pos, ALIGNMENT if len(view) >= ALIGNMENT else 64)
            formats.put_bytes(fh.fileno(), view, start, src.span(name))
            pos = start + len(view)
            _external(inits[name], path.name, start, len(view))
        os.ftruncate(fh.fileno(), pos)
    return pos


def _write_header(run: _Run, entries: dict, stage: Path) -> list[dict]:
    """model.pb.bin, the header indexing model.bin; returns its operators."""
    from raipack.stages.fuse.graph import DOMAIN

    fg, profile, L, names = run.fg, run.profile, run.L, run.names
    operators = [{
        "name": f.name, "op_type": f.op_type, "function": f"{DOMAIN}.{f.function}", "layer": f.layer, "device": "npu",
        "meta": f"cache/{f.name}_meta.json", "inputs": f.inputs, "outputs": f.outputs,
        "tensors": [{"role": role, **entries[name]} for role, name in f.weights if name in entries],
        "cpu_inputs": [name for role, name in f.weights if name not in entries],
    } for f in fg.fused]
    header = {
        "format": formats.HEADER_FORMAT, "format_version": formats.FORMAT_VERSION,
        "generator": "raipack fuse (reference backend)", "weights_file": names["weights"], "weights_size": run.written[names["weights"]],
        "alignment": ALIGNMENT, "graph": names["graph"], "profile": profile.id, "release": profile.release,
        "model": run.dims, "packing": {"MatMulNBits": formats.MATMULNBITS_PACKING},
        "tiers": {"prefill": L["prefill"], "token": L["token"], "max_length": L["max_length"], "node": NODE},
        "operators": operators, "cpu_nodes": fg.cpu_nodes,
    }
    header_bytes = formats.encode_header(header)
    (stage / names["header"]).write_bytes(header_bytes)
    run.written[names["header"]] = len(header_bytes)
    run.header_sha = formats.sha256_hex(header_bytes)
    run.graph_sha = sha256_file(stage / names["graph"])
    return operators


def _write_cache(run: _Run, operators: list[dict], stage: Path) -> None:
    """cache/: a descriptor (.const) and a meta file per fused node."""
    from raipack.stages.fuse.graph import attr_value

    cache = stage / "cache"
    cache.mkdir(exist_ok=True)
    for f, op in zip(run.fg.fused, operators):
        attrs = {ref: attr_value(a) for ref, a in f.attrs.items()}
        desc = formats.encode_const({"format": "raipack-node-descriptor", "format_version": 1, "node": f.name, "op_type": f.op_type,
                                     "layer": f.layer, "attrs": attrs, "inputs": f.inputs, "outputs": f.outputs,
                                     "tensors": [{k: t[k] for k in ("role", "name", "offset", "size", "dtype", "shape")} for t in op["tensors"]],
                                     "header_sha256": run.header_sha})
        (cache / f"{f.name}.const").write_bytes(desc)
        tmap = {"descriptor": {"file_name": f"{f.name}.const", "file_size": len(desc)}}
        for t in op["tensors"]:
            tmap[t["role"]] = {"packed_buffer_label": run.names["weights"], "offset": t["offset"], "size_in_bytes": t["size"]}
        ops = f.npu_ops()
        for o in ops:
            if o["type"] == "MladfMatMul":
                o["attrs"]["total_seq_len"] = run.settings.max_length
        run.written[f"cache/{f.name}_meta.json"] = _json(cache / f"{f.name}_meta.json", {
            "dd_meta_major_version": 1, "dd_meta_minor_version": 4, "op_list": ops, "tensor_map": tmap, "state_table_updates": [],
            "raipack": {"format": "raipack-cache-meta", "format_version": 1, "node": f.name, "op_type": f.op_type, "layer": f.layer,
                        "header": run.names["header"], "note": "raipack's open layout; not AMD's dynamic-dispatch format"}})
        run.written[f"cache/{f.name}.const"] = len(desc)
    run.report("cache", 1, 1)


def _phases(S: NpuSettings) -> list[str]:
    """The phases with compiled tiers, each with its shared schedule and plans (none in a tierless
    hybrid layout, whose decode runs on the iGPU)."""
    return [phase for phase, tiers in (("prefill", S.prefill), ("token", S.token)) if tiers]


def _tier_jobs(S: NpuSettings) -> dict:
    """phase -> [(tier, sequence length, KV window)] of every plan."""
    return {"prefill": [(t, t, _token_window(S.token, t)) for t in S.prefill], "token": [(t, 1, t) for t in S.token]}


def _tier_plans(run: _Run, schedules: dict) -> list[tuple[str, int, bytes]]:
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


def _write_plans(run: _Run, stage: Path, planned: list[tuple[str, int, bytes]]) -> None:
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


def _plan_io(run: _Run) -> dict:
    return {k: run.fg.io[k] for k in ("input_ids", "attention_mask", "logits")}


def _write_schedule(run: _Run, stage: Path, phase: str):
    """The schedule every tier of `phase` shares; returns it prepared and {file, sha256} for the plans."""
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


def _write_configs(run: _Run, stage: Path) -> None:
    """genai_config.json (the settings' provider options and search), rai_config.json, config.json,
    the tokenizer and license files, the card."""
    copied = []
    for name in CONFIG_FILES:
        for d in (run.export_dir, run.quark_dir):
            if d and (d / name).is_file():
                shutil.copy2(d / name, stage / name)
                copied.append(name)
                break
    gen_cfg = {}
    if (stage / "generation_config.json").is_file():
        gen_cfg = json.loads((stage / "generation_config.json").read_text("utf-8"))
    L = run.L
    new_genai = _genai_config(run.genai, run.settings.provider_options(run.profile), L, gen_cfg, run.names["graph"])
    run.written["genai_config.json"] = _json(stage / "genai_config.json", new_genai)
    run.written["rai_config.json"] = _json(stage / "rai_config.json", {"max_prompt_length": L["max_prompt_length"]})
    run.written["config.json"] = _json(stage / "config.json", run.model_config)
    prompts = write_prompts_file(stage, [n for n in defaults()["lengths"] if n <= (run.settings.prompt_limit(run.profile, run.profile.release) or (0,))[0]])
    if prompts:  # what raipack bench runs, as AMD's packages ship it; written now, since a sealed package is never edited
        run.written["prompts.txt"] = prompts
    card = _readme(run.model_config, run.profile, L, run)
    (stage / "README.md").write_text(card, "utf-8")
    run.written["README.md"] = len(card.encode())
    for name in copied:
        run.written.setdefault(name, (stage / name).stat().st_size)


def _fuse_report(run: _Run, t0: float) -> dict:
    fg, L = run.fg, run.L
    return {
        "backend": "reference",
        "profile": run.profile.id,
        "seconds": round(time.perf_counter() - t0, 3),
        "fused_nodes": [{"name": f.name, "op_type": f.op_type, "layer": f.layer, "members": [n.name for n in f.members]} for f in fg.fused],
        "fused_counts": _counts(fg.fused),
        "cpu_nodes": fg.cpu_nodes,
        "npu_tensors": len(fg.npu_initializers),
        "cpu_tensors": len(fg.cpu_initializers),
        "bytes_written": sum(run.written.values()),
        "files": run.written,
        "lengths": L,
        "findings": [f.to_dict() for f in run.findings],
        "npu_complete": not any(f.severity == "error" for f in run.findings),
        "summary": f"{len(fg.fused)} fused nodes, {len(L['prefill'])} prefill + {len(L['token'])} token tiers, max_length {L['max_length']}",
    }


def _counts(fused) -> dict:
    out: dict[str, int] = {}
    for f in fused:
        out[f.op_type] = out.get(f.op_type, 0) + 1
    return out


def _genai_config(genai: dict, opts: dict, L: dict, gen_cfg: dict, graph: str) -> dict:
    doc = json.loads(json.dumps(genai))
    dec = doc["model"]["decoder"]
    session = dict(dec.get("session_options") or {})
    session.setdefault("log_id", "onnxruntime-genai")
    session["provider_options"] = [{"RyzenAI": opts}]
    dec["session_options"] = session
    dec["filename"] = graph
    search = doc.setdefault("search", {})
    search["max_length"] = L["max_length"]
    if L["chunk_size"]:
        search["chunk_size"] = L["chunk_size"]
    else:
        search.pop("chunk_size", None)
    search["past_present_share_buffer"] = True
    search["num_beams"] = 1
    for key in SAMPLING_KEYS:
        if key in gen_cfg and gen_cfg[key] is not None:
            search[key] = gen_cfg[key]
    return doc


def _readme(model_config: dict, profile: Profile, L: dict, run: _Run) -> str:
    fg, written, findings, names = run.fg, run.written, run.findings, run.names
    name = model_config.get("_name_or_path") or (model_config.get("architectures") or ["model"])[0]
    name = str(name).rstrip("/").rsplit("/", 1)[-1] or "model"
    w = (model_config.get("quantization_config") or {}).get("global_quant_config", {}).get("weight", {})
    counts = _counts(fg.fused)
    lines = [
        f"# {name} — raipack reference package ({profile.id})", "",
        f"This folder follows the file layout of AMD's Ryzen AI {profile.release} {_kind(L)} packages (`{names['graph']}`, `{names['data']}`, "
        f"`{names['weights']}`, `{names['header']}`, `cache/`{', `dd_metastate_*`' if L['prefill'] else ''}, `genai_config.json`, `rai_config.json`).", "",
        f"**The binary files (`{names['weights']}`, `{names['header']}`, `cache/*.const`{', `dd_metastate_*`' if L['prefill'] else ''}) are in raipack's own documented "
        "open format (docs/formats.md in the raipack repository). They are NOT loadable by AMD's proprietary Ryzen AI runtime "
        "or by `model_generate` output consumers; only raipack's reference runtime executes this package (on the CPU, the way "
        "the NPU runtime would: static KV buffer, prompts padded to a tier, one token at a time).**", "",
        "## Contents", "",
        f"- Quantization: {w.get('dtype', 'uint4')}, group size {w.get('group_size', '?')}, "
        f"{'symmetric' if w.get('symmetric') else 'asymmetric'} (Quark; `config.json` keeps its `quantization_config`).",
        "- Fused operators (domain `ai.raipack`, each an ONNX local function): " + ", ".join(f"{k} ×{v}" for k, v in sorted(counts.items())) + ".",
        _lengths_line(L),
        "- Longest prompt per Ryzen AI version (`rai_config.json`): " + ", ".join(f"{v}: {n}" for v, n in sorted(L["max_prompt_length"].items())) + ".",
        f"- `{names['weights']}` {written.get(names['weights'], 0)} bytes (NPU side), `{names['data']}` {written.get(names['data'], 0)} bytes (CPU side).",
    ]
    left = [n for n in fg.cpu_nodes if n["why"] == "not fused"]
    if left or findings:
        lines += ["", "## Not on the NPU", ""]
        lines += [f"- {f.severity}: {f.message}" for f in findings]
    lines += ["", "## Run it", "", "```sh", "raipack run <this folder> --prompt \"What is the capital of France?\"", "```", "",
              "`raipack validate <this folder>` checks it first; `raipack run --help` lists the options.", ""]
    return "\n".join(lines)


def _kind(L: dict) -> str:
    return "NPU" if L["prefill"] else "hybrid (NPU prefill, iGPU decode)"


def _lengths_line(L: dict) -> str:
    if not L["prefill"]:
        return (f"- Maximum length {L['max_length']} tokens (one KV buffer, decoded on the iGPU); one NPU prefill pass "
                f"takes up to {L['npu_seq']} tokens (`hybrid_opt_max_seq_length`); no tiers, no `dd_metastate_*`.")
    return (f"- Maximum length {L['max_length']} tokens; prefill tiers {L['prefill']}; token tiers {L['token']}; "
            f"chunked prefill {'on (chunk ' + str(L['chunk_size'] or L['npu_seq']) + ')' if L['chunked'] else 'off'}.")
