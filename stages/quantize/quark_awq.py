"""Weight-only UINT4 quantization of a Hugging Face causal LM with AMD Quark 0.13.

Scheme ``uint4_wo_<group>``: asymmetric per-group UINT4 weights, float activations,
``lm_head`` excluded; algorithm AWQ (default), GPTQ or plain round-to-nearest (RTN).
The result is Quark's Hugging Face export (``custom_mode="quark"``,
``weight_format="real_quantized"``, ``pack_method="reorder"``) plus every file of the
source folder Quark does not copy (tokenizer, chat template, generation config, custom
code...), written into ``out_dir`` (new or empty: pipeline.core.output.output_folder;
the build runner stages the folder and swaps it into place).

Everything cheap is checked before anything heavy runs (stages/quantize/preflight.py), and Quark
must have a template for the architecture. The CPU runtime settings are in runtime.py, the
files written after Quark's export in quark_export.py.

torch, transformers and quark are imported inside the functions that need them.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.core.errors import RaipackError
from stages.quantize.preflight import HINT, GroupSize, check_source_dir, read_config, resolve_group_size, text_config
from stages.quantize.quark_export import copy_missing_files, fix_config, quantized_tensor_names, versions
from stages.quantize.runtime import apply_runtime_settings, peak_rss_bytes, release_memory, reset_peak_rss

Progress = Callable[[str, int, int], None]

ALGORITHMS = ("awq", "gptq", "rtn")
DTYPES = ("float32", "bfloat16", "float16")

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


# Quark's per-decoder-layer loops iterate `tqdm(range(n_layers), desc=...)` through the name
# `tqdm` bound in these modules; the wrapper below reports each finished layer.
_LAYER_LOOPS = {
    "quark.torch.algorithm.awq.awq": "awq",
    "quark.torch.algorithm.common": "gptq",
}


@contextmanager
def _report_layers(progress: Progress | None) -> Iterator[None]:
    if progress is None:
        yield
        return
    import importlib

    saved = []
    for module_name, stage in _LAYER_LOOPS.items():
        module = importlib.import_module(module_name)
        original = module.tqdm

        def wrapper(iterable: Any = None, *args: Any, _orig: Any = original, _stage: str = stage, **kwargs: Any) -> Any:
            bar = _orig(iterable, *args, **kwargs)
            total = kwargs.get("total") or (len(iterable) if hasattr(iterable, "__len__") else 0)

            def gen() -> Iterator[Any]:
                for i, item in enumerate(bar, start=1):
                    yield item
                    progress(_stage, i, total)

            return gen()

        saved.append((module, original))
        module.tqdm = wrapper
    try:
        yield
    finally:
        for module, original in saved:
            module.tqdm = original


def quantize(
    src_dir: Path,
    out_dir: Path,
    *,
    algorithm: str = "awq",
    group_size: GroupSize = 128,
    exclude_layers: Sequence[str] = ("lm_head",),
    calib_texts: list[str] | None = None,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    seq_len: int = DEFAULT_SEQ_LEN,
    dtype: str = "float32",
    device: str = "cpu",
    progress: Progress | None = None,
    tune_runtime: bool = True,
    notify: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Quantize the safetensors model in ``src_dir`` to a Quark UINT4 export in ``out_dir``.

    ``calib_texts`` are the calibration documents (``None``: the bundled corpus); AWQ and
    GPTQ use ``num_samples`` windows of ``seq_len`` tokens, RTN uses none. ``progress`` is
    called as ``progress(step, done, total)`` with step ``"calibration"`` per calibration
    batch and ``"awq"``/``"gptq"`` per finished decoder layer. ``tune_runtime`` applies
    ``apply_runtime_settings()`` on CPU (off only to measure without it). ``notify`` gets
    a line while Quark waits for another build compiling its extension (default: stderr).
    Returns a record of the run.
    """
    start = time.perf_counter()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    algorithm = algorithm.lower()
    exclude = list(exclude_layers)
    # -- cheap checks, before torch is even imported
    cfg, chosen, warns = _check_inputs(src_dir, out_dir, algorithm, dtype, group_size, exclude)
    model_type = text_config(cfg).get("model_type") or cfg.get("model_type")

    # before quark is imported: some of its switches are read at import time
    runtime = apply_runtime_settings() if tune_runtime and device == "cpu" else {}
    from pipeline.core.quark_import import import_quark

    import_quark(**({"say": notify} if notify else {}))  # never hangs on a killed build's compile lock
    scheme = f"uint4_wo_{chosen}"
    qconfig = _quark_config(src_dir, model_type, scheme, algorithm, exclude)
    peak_reset = reset_peak_rss()

    t_load = time.perf_counter()
    batches, calibration = _calibration(src_dir, algorithm, calib_texts, num_samples, seq_len, device, progress)
    model = _load_model(src_dir, dtype, device)
    load_seconds = time.perf_counter() - t_load
    out = _quantize_and_export(model, qconfig, batches, src_dir, out_dir, cfg, progress)
    del model, batches

    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    peak_rss = peak_rss_bytes()
    release_memory()
    return {
        "algorithm": algorithm,
        "scheme": scheme,
        "group_size": chosen,
        "group_size_requested": group_size,
        "exclude_layers": exclude,
        "dtype": dtype,
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
        "seconds_quantize": round(out["quantize_seconds"], 2),
        "seconds_export": round(out["export_seconds"], 2),
        "cpu_user_seconds": round(ru1.ru_utime - ru0.ru_utime, 2),
        "cpu_system_seconds": round(ru1.ru_stime - ru0.ru_stime, 2),
        "peak_rss_bytes": peak_rss,
        "peak_rss_scope": "this call" if peak_reset else "process lifetime",
        "runtime": {k: v for k, v in runtime.items() if k != "env"},
        "versions": versions(),
    }


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


def _quark_config(src_dir: Path, model_type: str | None, scheme: str, algorithm: str, exclude: list[str]) -> Any:
    """Quark's configuration for the scheme, from its template for the architecture."""
    from quark.torch import LLMTemplate

    try:
        template = LLMTemplate.get(model_type)
    except ValueError:
        raise RaipackError(
            f"{src_dir}: Quark 0.13 has no template for model_type {model_type!r}; "
            f"supported: {', '.join(sorted(LLMTemplate.list_available()))}", HINT
        ) from None
    return template.get_config(scheme=scheme, algorithm=None if algorithm == "rtn" else algorithm, kv_cache_scheme=None, exclude_layers=exclude)


def _calibration(src_dir: Path, algorithm: str, calib_texts: list[str] | None, num_samples: int, seq_len: int, device: str,
                 progress: Progress | None) -> tuple[_CalibrationBatches | None, dict | None]:
    """The calibration batches and their record (None for RTN), tokenized before the weights are loaded: bad data fails fast."""
    from transformers import AutoTokenizer

    from stages.quantize.calibration import DEFAULT_CALIBRATION, read_texts, tokenize_texts

    tokenizer = AutoTokenizer.from_pretrained(str(src_dir), trust_remote_code=False, local_files_only=True)
    if algorithm == "rtn":
        return None, None
    texts = calib_texts if calib_texts is not None else read_texts(DEFAULT_CALIBRATION)
    source = "calib_texts" if calib_texts is not None else str(DEFAULT_CALIBRATION)
    samples = [s.to(device) for s in tokenize_texts(texts, tokenizer, num_samples, seq_len, source=source)]
    return _CalibrationBatches(samples, progress), {"num_samples": num_samples, "seq_len": seq_len, "tokens": num_samples * seq_len}


def _load_model(src_dir: Path, dtype: str, device: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(src_dir), dtype=getattr(torch, dtype), trust_remote_code=False, local_files_only=True, use_safetensors=True)
    model.eval()
    model.to(device)
    return model


def _quantize_and_export(model: Any, qconfig: Any, batches: Any, src_dir: Path, out_dir: Path, cfg: dict, progress: Progress | None) -> dict[str, Any]:
    """Quark's quantize, freeze and export into ``out_dir`` (new or empty), then the files Quark does not write."""
    import torch
    from quark.torch import ModelQuantizer, export_safetensors

    from pipeline.core.output import output_folder

    with output_folder(out_dir) as tmp:
        t_q = time.perf_counter()
        with _report_layers(progress), torch.no_grad():
            quantizer = ModelQuantizer(qconfig)
            model = quantizer.quantize_model(model, batches)
            model = quantizer.freeze(model)
        quantize_seconds = time.perf_counter() - t_q
        t_e = time.perf_counter()
        export_safetensors(model, str(tmp), custom_mode="quark", weight_format="real_quantized", pack_method="reorder")
        export_seconds = time.perf_counter() - t_e
        qc = fix_config(tmp, cfg)
        copied = copy_missing_files(src_dir, tmp)
        quantized = quantized_tensor_names(tmp)
        files = sorted(p.name for p in tmp.iterdir())
    del model, quantizer
    return {"qc": qc, "copied": copied, "quantized": quantized, "files": files, "quantize_seconds": quantize_seconds, "export_seconds": export_seconds}
