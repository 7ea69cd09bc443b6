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

This module reads the export and writes the weights, the header and cache/; the schedules and plans
are tier_plans.py's, the configuration files and the card configs.py's, the run they share fuse_run.py's.
Tiers, lengths, options and constraints all come from the profile; nothing here is a tier constant.
The weights are never loaded into Python objects: the source `model.onnx.data` is memory-mapped and
slices of it are written out while a thread pool hashes them.
"""

from __future__ import annotations

import json
import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

from raipack.core.errors import RaipackError
from raipack.core.findings import Finding
from raipack.core.hashing import sha256_file
from raipack.core.output import output_folder
from raipack.npu import formats
from raipack.npu import profile as profiles
from raipack.npu.formats import ALIGNMENT
from raipack.npu.layout import package_files
from raipack.npu.settings import NpuSettings, is_power_of_two
from raipack.npu.spec import Profile
from raipack.stages.fuse.configs import fused_counts, write_configs
from raipack.stages.fuse.fuse_run import NODE, FuseRun, write_json
from raipack.stages.fuse.tier_plans import phases, tier_plans, write_plans, write_schedule


def lengths_for(profile: Profile, context_length: int | None) -> NpuSettings:
    """The NPU settings of a package built for `profile` from a model of `context_length` positions
    (pipeline/npu/settings.py: the same model the checks and the runtime read)."""
    return NpuSettings.from_profile(profile, context_length)  # SettingsError (a RaipackError) names the profile and the tier


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


def fuse(export_dir: Path, out_dir: Path, profile: Profile, *, quark_dir: Path | None = None, progress=None) -> dict:
    """Fuse an OGA int4 export into a reference package in `out_dir` (new or empty). Returns the
    report: fused nodes, bytes written, constraint findings (dicts like validator findings), seconds."""
    t0 = time.perf_counter()
    export_dir, out_dir = Path(export_dir).resolve(), Path(out_dir).resolve()
    run = _prepare(export_dir, Path(quark_dir).resolve() if quark_dir else None, profile, progress)
    with closing(_Source(export_dir, run.model)) as src, output_folder(out_dir) as stage, ThreadPoolExecutor(1) as pool:
        # the schedules read the graph before the weights step rewrites its initializers; the tiers'
        # plans (pure Python) are then made on a thread while the kernel copies the weights
        schedules = {phase: write_schedule(run, stage, phase) for phase in phases(run.settings)}
        planned = pool.submit(tier_plans, run, schedules)
        entries = _write_weights(run, src, stage)
        operators = _write_header(run, entries, stage)
        _write_cache(run, operators, stage)
        write_plans(run, stage, planned.result())
        write_configs(run, stage)
    return _fuse_report(run, t0)


def _prepare(export_dir: Path, quark_dir: Path | None, profile: Profile, progress) -> FuseRun:
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
    run = FuseRun(export_dir, quark_dir, profile, genai, model, lengths_for(profile, context), report=progress or (lambda what, done, total: None),
               names=package_files(profile))
    npu_seq = run.settings.npu_seq
    if not is_power_of_two(npu_seq):
        run.findings.append(Finding("fuse-lengths", "error", "genai_config.json", f"the largest prefill tier {npu_seq} is not a power of two, but hybrid_opt_max_seq_length must be",
                                    "make the profile's largest prefill tier a power of two", "/model/decoder/session_options"))
    # late: fuse.graph loads onnx and numpy, only when the reference fuse runs
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


def _read_model_config(run: FuseRun) -> None:
    """The Quark config.json the package keeps (with its quantization_config)."""
    config_src = next((d / "config.json" for d in (run.quark_dir, run.export_dir) if d and (d / "config.json").is_file()), None)
    if config_src is None:
        raise RaipackError(f"no config.json in {run.quark_dir or run.export_dir}: the package keeps the Quark config.json with its quantization_config",
                        "pass quark_dir (the quantize stage's output folder)")
    run.model_config = json.loads(config_src.read_text("utf-8"))
    if (run.model_config.get("quantization_config") or {}).get("quant_method") != "quark" and run.profile.quantization.config_json == "quark":
        run.findings.append(Finding("fuse-config", "error", "config.json", f"{config_src} has no Quark quantization_config; profile {run.profile.id} packages keep it",
                                    "pass the Quark export folder as quark_dir", "/quantization_config"))


def _write_weights(run: FuseRun, src: _Source, stage: Path) -> dict:
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


def _write_header(run: FuseRun, entries: dict, stage: Path) -> list[dict]:
    """model.pb.bin, the header indexing model.bin; returns its operators."""
    # late: fuse.graph loads onnx and numpy, only when the reference fuse runs
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


def _write_cache(run: FuseRun, operators: list[dict], stage: Path) -> None:
    """cache/: a descriptor (.const) and a meta file per fused node."""
    # late: fuse.graph loads onnx and numpy, only when the reference fuse runs
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
        run.written[f"cache/{f.name}_meta.json"] = write_json(cache / f"{f.name}_meta.json", {
            "dd_meta_major_version": 1, "dd_meta_minor_version": 4, "op_list": ops, "tensor_map": tmap, "state_table_updates": [],
            "raipack": {"format": "raipack-cache-meta", "format_version": 1, "node": f.name, "op_type": f.op_type, "layer": f.layer,
                        "header": run.names["header"], "note": "raipack's open layout; not AMD's dynamic-dispatch format"}})
        run.written[f"cache/{f.name}.const"] = len(desc)
    run.report("cache", 1, 1)


def _fuse_report(run: FuseRun, t0: float) -> dict:
    fg, L = run.fg, run.L
    return {
        "backend": "reference",
        "profile": run.profile.id,
        "seconds": round(time.perf_counter() - t0, 3),
        "fused_nodes": [{"name": f.name, "op_type": f.op_type, "layer": f.layer, "members": [n.name for n in f.members]} for f in fg.fused],
        "fused_counts": fused_counts(fg.fused),
        "cpu_nodes": fg.cpu_nodes,
        "npu_tensors": len(fg.npu_initializers),
        "cpu_tensors": len(fg.cpu_initializers),
        "bytes_written": sum(run.written.values()),
        "files": run.written,
        "lengths": L,
        "genai_keys_dropped": run.dropped_keys,  # the export's keys the release's onnxruntime-genai refuses (RP204)
        "findings": [f.to_dict() for f in run.findings],
        "npu_complete": not any(f.severity == "error" for f in run.findings),
        "summary": f"{len(fg.fused)} fused nodes, {len(L['prefill'])} prefill + {len(L['token'])} token tiers, max_length {L['max_length']}",
    }


