"""Weight-only UINT4 quantization of a Hugging Face causal LM with AMD Quark 0.13.

Scheme ``uint4_wo_<group>``: asymmetric per-group UINT4 weights, float activations, ``lm_head``
excluded; algorithm AWQ (default), GPTQ or plain round-to-nearest (RTN). The result is Quark's Hugging
Face export (``custom_mode="quark"``, ``weight_format="real_quantized"``, ``pack_method="reorder"``) plus
every file of the source folder Quark does not copy (tokenizer, chat template, generation config, custom
code...), written into ``out_dir`` (new or empty: raipack.core.output.output_folder; the build runner
stages the folder and swaps it into place).

Everything cheap is checked before anything heavy runs (stages/quantize/preflight.py), and Quark
must have a template for the architecture. The CPU runtime settings are in runtime.py, the hooks
into Quark's layer and export loops in quark_loops.py, the files written after Quark's export in
quark_export.py.

torch, transformers and quark are imported inside the functions that need them.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from raipack.core.errors import RaipackError
from raipack.core.memory import peak_rss_bytes, reset_peak_rss
from raipack.stages.quantize import awq_groups
from raipack.stages.quantize.awq_clip import bounded_clip_search
from raipack.stages.quantize.owned import own_mapped_tensors
from raipack.stages.quantize.preflight import (
    HINT,
    GroupSize,
    LmHead,
    check_source_dir,
    read_config,
    resolve_dtype,
    resolve_group_size,
    resolve_lm_head,
    text_config,
)
from raipack.stages.quantize.quark_export import copy_missing_files, fix_config, quantized_tensor_names, versions
from raipack.stages.quantize.quark_loops import Progress, report_layers, trim_while_converting
from raipack.stages.quantize.runtime import apply_runtime_settings, release_memory, restore_denormals

ALGORITHMS = ("awq", "gptq", "rtn")
DTYPES = ("auto", "float32", "bfloat16", "float16")

# Default calibration, chosen by measurement (docs/measurements/quantize.md): AWQ on the
# example model (SmolLM2-135M, 30 layers) takes 6.0 min wall on 2 shared cores with the
# runtime settings below; 8 x 256 took 6.8 min, too close to the 7-minute budget.
DEFAULT_NUM_SAMPLES = 4
DEFAULT_SEQ_LEN = 256


# --------------------------------------------------------------------------- progress


class _CalibrationBatches:
    """A re-iterable of ``[1, seq_len]`` tensors that reports each batch as it is consumed."""

    def __init__(self, samples: list[Any], progress: Progress | None):
        self.samples = samples
        self.progress = progress

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[Any]:
        n = len(self.samples)
        for i, sample in enumerate(self.samples, start=1):
            yield sample
            if self.progress is not None:
                self.progress("calibration", i, n)


@dataclass(frozen=True)
class QuantizeSettings:
    """How `quantize` runs (see its docstring for each)."""

    algorithm: str = "awq"
    group_size: GroupSize = 128
    exclude_layers: Sequence[str] = ("lm_head",)
    calib_texts: list[str] | None = None
    num_samples: int = DEFAULT_NUM_SAMPLES
    seq_len: int = DEFAULT_SEQ_LEN
    dtype: str = "auto"  # "auto": the source's (preflight.resolve_dtype)
    device: str = "cpu"
    progress: Progress | None = None
    tune_runtime: bool = True
    notify: Callable[[str], None] | None = None
    lm_head: LmHead = "exclude"
    # run on the float model as loaded, before Quark changes it (the stage's source probe: the source is read from disk
    # once); what it returns is the record's "source_probe", its time not counted in seconds_load
    before: Callable[[Any], dict] | None = None


@dataclass
class _Quantization:
    """What Quark's quantizer runs with: the loaded model (dropped once quantized), its config, the calibration."""

    model: Any
    qconfig: Any
    batches: Any
    progress: Progress | None
    awq_record: Callable[[list], dict] | None = None


def quantize(src_dir: Path, out_dir: Path, settings: QuantizeSettings | None = None, /, **fields) -> dict[str, Any]:
    """Quantize the safetensors model in ``src_dir`` to a Quark UINT4 export in ``out_dir``; ``fields`` set
    QuantizeSettings' fields over ``settings`` (quantize(src, out, algorithm="rtn")).

    ``calib_texts`` are the calibration documents (``None``: the bundled corpus); AWQ and
    GPTQ use ``num_samples`` windows of ``seq_len`` tokens, RTN uses none. ``progress`` is
    called as ``progress(step, done, total)`` with step ``"calibration"`` per calibration
    batch and ``"awq"``/``"gptq"`` per finished decoder layer. ``tune_runtime`` applies
    ``apply_runtime_settings()`` on CPU (off only to measure without it). ``notify`` gets
    a line while Quark waits for another build compiling its extension (default: stderr).
    ``lm_head``: "exclude" (AMD's NPU recipe) or a group size (32, 64, 128) to quantize it
    uint4 asymmetric with its own group, as AMD's hybrid checkpoints do (g32).
    Returns a record of the run.
    """
    start = time.perf_counter()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    opts = replace(settings or QuantizeSettings(), **fields)
    opts = replace(opts, algorithm=opts.algorithm.lower())
    algorithm, group_size, dtype, device, notify = opts.algorithm, opts.group_size, opts.dtype, opts.device, opts.notify
    exclude = list(opts.exclude_layers)
    # -- cheap checks, before torch is even imported
    cfg, chosen, warns = _check_inputs(src_dir, out_dir, algorithm, dtype, group_size, exclude)
    head = resolve_lm_head(cfg, opts.lm_head, str(src_dir / "config.json"))
    dtype = resolve_dtype(dtype, cfg, device)
    if head != "exclude":
        exclude = [e for e in exclude if e != "lm_head"]
    model_type = text_config(cfg).get("model_type") or cfg.get("model_type")

    # before quark is imported: some of its switches are read at import time
    runtime = apply_runtime_settings() if opts.tune_runtime and device == "cpu" else {}
    try:  # the allocator tuning ends with this call, also a failed one
        # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
        from raipack.stages.quark_import import import_quark

        import_quark(**({"say": notify} if notify else {}))  # never hangs on a killed build's compile lock
        scheme = f"uint4_wo_{chosen}"
        qconfig, awq_source = _quark_config(src_dir, model_type, scheme, algorithm, exclude, head)
        peak_reset = reset_peak_rss()

        t_load = time.perf_counter()
        batches, calibration = _calibration(src_dir, opts)
        model, owned = _load_model(src_dir, dtype, device, quantize_head=head != "exclude")
        load_seconds = time.perf_counter() - t_load
        source_probe = opts.before(model) if opts.before is not None else None
        untied = head != "exclude" and _untie_lm_head(model)
        if untied:
            warns.append("lm_head shares its weights with the token embedding; it is quantized as its own copy and the embedding stays float "
                         "(the export says tie_word_embeddings false and carries both tables)")

        def awq_record(scaled: list) -> dict:  # before the export: AWQ that scaled nothing writes nothing
            configured = awq_groups.configured_groups(model_type, qconfig.algo_config[0])
            record = awq_groups.summarize(configured, scaled, text_config(cfg).get("num_hidden_layers"), awq_source)
            warns.extend(awq_groups.check_applied(record, model_type, str(src_dir)))
            return record

        run = _Quantization(model, qconfig, batches, opts.progress, awq_record if algorithm == "awq" else None)
        del model, batches
        out = _quantize_and_export(run, src_dir, out_dir, cfg)
        del run
        awq = out["awq"]

        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        peak_rss = peak_rss_bytes()
        return {
            "algorithm": algorithm,
            "scheme": scheme,
            "group_size": chosen,
            "group_size_requested": group_size,
            "exclude_layers": exclude,
            "lm_head": head if head == "exclude" else {"group_size": head, "scheme": f"uint4_wo_{head}", "untied_from_embedding": untied},
            "awq": awq,
            "dtype": dtype,
            "dtype_requested": opts.dtype,
            "device": device,
            "model_type": model_type,
            "layers_quantized": len(out["quantized"]),
            "decoder_layers": text_config(cfg).get("num_hidden_layers"),
            "calibration": calibration,
            "quant_method": out["qc"].get("quant_method"),
            "copied_files": out["copied"],
            "files": out["files"],
            "warnings": warns,
            "seconds": round(time.perf_counter() - start, 2),
            "seconds_load": round(load_seconds, 2),
            **({"source_probe": source_probe} if source_probe is not None else {}),
            "weights_owned": owned,  # tensors moved out of the mapped safetensors before Quark writes into them
            "seconds_quantize": round(out["quantize_seconds"], 2),
            "seconds_export": round(out["export_seconds"], 2),
            "cpu_user_seconds": round(ru1.ru_utime - ru0.ru_utime, 2),
            "cpu_system_seconds": round(ru1.ru_stime - ru0.ru_stime, 2),
            "peak_rss_bytes": peak_rss,
            "peak_rss_scope": "this call" if peak_reset else "process lifetime",
            "runtime": {k: v for k, v in runtime.items() if k != "env"},
            "versions": versions(),
        }
    finally:
        release_memory()
        if runtime.get("flush_denormal"):
            restore_denormals()


def _check_inputs(src_dir: Path, out_dir: Path, algorithm: str, dtype: str, group_size: GroupSize, exclude: list[str]) -> tuple[dict, int, list[str]]:
    """(source config, group size to use, warnings); one sentence on anything wrong with the options or the source."""
    if algorithm not in ALGORITHMS:
        raise RaipackError(f"algorithm {algorithm!r} is not supported; expected one of {', '.join(ALGORITHMS)}", HINT)
    if dtype not in DTYPES:
        raise RaipackError(f"dtype {dtype!r} is not supported; expected one of {', '.join(DTYPES)}", HINT)
    warns = check_source_dir(src_dir)
    cfg = read_config(src_dir)
    chosen, warning = resolve_group_size(cfg, group_size, exclude)
    if warning:
        warns.append(warning)  # the quantize stage prints it as one line
    if out_dir.resolve() == src_dir.resolve():
        raise RaipackError(f"{out_dir}: the output folder must differ from the source folder", HINT)
    return cfg, chosen, warns


def _quark_config(src_dir: Path, model_type: str | None, scheme: str, algorithm: str, exclude: list[str], lm_head: LmHead) -> tuple[Any, str | None]:
    """Quark's configuration for the scheme, from its template for the architecture, and where AWQ's groups come from.

    A quantized lm_head gets its own ``uint4_wo_<g>`` layer config (Quark records it in the export's
    ``layer_quant_config``)."""
    template = awq_groups.template(model_type, str(src_dir))
    algo_configs, source = None, None
    if algorithm == "awq":
        custom, source = awq_groups.awq_config(model_type)
        if source == "none":
            raise RaipackError(f"{src_dir}: neither Quark 0.13 nor raipack has AWQ scaling groups for model_type {model_type!r}, so AWQ would scale nothing",
                               'add them to stages/quantize/data/awq.json, or use algorithm = "rtn" knowingly')
        algo_configs = {"awq": custom} if custom is not None else None
    layer_config = None if lm_head == "exclude" else {"lm_head": f"uint4_wo_{lm_head}"}
    qconfig = template.get_config(scheme=scheme, algorithm=None if algorithm == "rtn" else algorithm, kv_cache_scheme=None,
                                  exclude_layers=exclude, layer_config=layer_config, algo_configs=algo_configs)
    return qconfig, source


def _calibration(src_dir: Path, opts: QuantizeSettings) -> tuple[_CalibrationBatches | None, dict | None]:
    """The calibration batches and their record (None for RTN), tokenized before the weights are loaded: bad data fails fast."""
    calib_texts, num_samples, seq_len = opts.calib_texts, opts.num_samples, opts.seq_len
    from transformers import AutoTokenizer

    # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
    from raipack.stages.quantize.calibration import DEFAULT_CALIBRATION, read_texts, tokenize_texts

    tokenizer = AutoTokenizer.from_pretrained(str(src_dir), trust_remote_code=False, local_files_only=True)
    if opts.algorithm == "rtn":
        return None, None
    texts = calib_texts if calib_texts is not None else read_texts(DEFAULT_CALIBRATION)
    source = "calib_texts" if calib_texts is not None else str(DEFAULT_CALIBRATION)
    samples = [s.to(opts.device) for s in tokenize_texts(texts, tokenizer, num_samples, seq_len, source=source)]
    return _CalibrationBatches(samples, opts.progress), {"num_samples": num_samples, "seq_len": seq_len, "tokens": num_samples * seq_len}


def _load_model(src_dir: Path, dtype: str, device: str, quantize_head: bool = False) -> tuple[Any, dict[str, int]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(src_dir), dtype=getattr(torch, dtype), trust_remote_code=False, local_files_only=True, use_safetensors=True)
    model.eval()
    # Quark writes the weights in place: views of the mapped file would keep a second copy (owned.py)
    head = model.get_output_embeddings()
    embed = model.get_input_embeddings()
    keep = [embed.weight if embed is not None else None, head.weight if head is not None and not quantize_head else None]
    owned = own_mapped_tensors(model, keep=keep) if device == "cpu" else {"tensors": 0, "bytes": 0, "kept_mapped_bytes": 0}
    model.to(device)
    return model, owned


def _untie_lm_head(model: Any) -> bool:
    """Give a tied lm_head its own weight before Quark quantizes it: Quark fake-quantizes the shared
    parameter in place, which would leave the embedding table the token gather reads quantized too.
    True when it was tied."""
    import torch

    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or embed is None or head.weight.data_ptr() != embed.weight.data_ptr():
        return False
    head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)
    model.config.tie_word_embeddings = False
    text = getattr(model.config, "text_config", None)
    if text is not None and hasattr(text, "tie_word_embeddings"):
        text.tie_word_embeddings = False
    return True


def _quantize_and_export(run: _Quantization, src_dir: Path, out_dir: Path, cfg: dict) -> dict[str, Any]:
    """Quark's quantize and export into ``out_dir`` (new or empty), then the files Quark does not write.
    ``run.awq_record`` gets the groups AWQ scaled right after quantization and may refuse them (nothing is written then)."""
    model, run.model = run.model, None  # this function holds the only reference: the float model is freed once quantized
    qconfig, batches, progress, awq_record = run.qconfig, run.batches, run.progress, run.awq_record
    import torch
    from quark.torch import ModelQuantizer, export_safetensors

    # late: the stage registry imports every stage by name; its work (torch, onnx, quark) loads only when the stage runs
    from raipack.core.output import output_folder

    with output_folder(out_dir) as tmp:
        t_q = time.perf_counter()
        with report_layers(progress), awq_groups.record_scaling() as scaled, bounded_clip_search() as clip_rows, torch.no_grad():
            quantizer = ModelQuantizer(qconfig)
            model = quantizer.quantize_model(model, batches)
            # with how Quark's clipping search was split (awq_clip.py): the fewest and most rows per call
            awq = {**awq_record(scaled), "clip_rows_per_call": [min(clip_rows, default=0), max(clip_rows, default=0)]} if awq_record else None
        # No freeze(): Quark documents it for torch.compile, and export_safetensors quantizes each QuantLinear
        # itself. freeze() first wrote every quantized linear again as a fake-quantized copy (+1.8x the linears'
        # size measured on Llama-3.2-1B in bfloat16) that the export then rounded a second time (in bfloat16 that
        # moved 0.7% of the packed words; in float32 the export is identical, tests/test_stages/test_quantize.py).
        # The allocator tuning that keeps AWQ's calibration fast ends here: kept through the export, freed
        # temporaries stayed in the heap beside the packed weights (+2.3 GiB at 1B, the same export time).
        release_memory()
        quantize_seconds = time.perf_counter() - t_q
        t_e = time.perf_counter()
        with trim_while_converting():
            export_safetensors(model, str(tmp), custom_mode="quark", weight_format="real_quantized", pack_method="reorder")
        export_seconds = time.perf_counter() - t_e
        qc = fix_config(tmp, cfg)
        copied = copy_missing_files(src_dir, tmp)
        quantized = quantized_tensor_names(tmp)
        files = sorted(p.name for p in tmp.iterdir())
    del model, quantizer
    return {"qc": qc, "awq": awq, "copied": copied, "quantized": quantized, "files": files, "quantize_seconds": quantize_seconds, "export_seconds": export_seconds}
