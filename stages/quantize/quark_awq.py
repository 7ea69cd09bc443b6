"""Weight-only UINT4 quantization of a Hugging Face causal LM with AMD Quark 0.13.

Scheme ``uint4_wo_<group>``: asymmetric per-group UINT4 weights, float activations,
``lm_head`` excluded; algorithm AWQ (default), GPTQ or plain round-to-nearest (RTN).
The result is Quark's Hugging Face export (``custom_mode="quark"``,
``weight_format="real_quantized"``, ``pack_method="reorder"``) plus every file of the
source folder Quark does not copy (tokenizer, chat template, generation config, custom
code...), written into ``out_dir`` (new or empty: pipeline.core.output.output_folder;
the build runner stages the folder and swaps it into place).

Everything cheap is checked before anything heavy runs: the folder holds safetensors
(pickle checkpoints are refused), Quark has a template for the architecture, and the
group size divides the input width of every linear layer that will be quantized
(Quark does not pad; it fails with a bare ``AssertionError`` deep inside AWQ otherwise).

torch, transformers and quark are imported inside the functions that need them.
"""

from __future__ import annotations

import fnmatch
import json
import os
import resource
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pipeline.core.errors import RaipackError

Progress = Callable[[str, int, int], None]
GroupSize = int | Literal["auto"]

ALGORITHMS = ("awq", "gptq", "rtn")
GROUP_SIZES = (128, 64, 32)  # the uint4_wo_<g> schemes Quark ships, preferred first
DTYPES = ("float32", "bfloat16", "float16")

# Default calibration, chosen by measurement (docs/measurements/quantize.md): AWQ on the
# example model (SmolLM2-135M, 30 layers) takes 6.0 min wall on 2 shared cores with the
# runtime settings below; 8 x 256 took 6.8 min, too close to the 7-minute budget.
DEFAULT_NUM_SAMPLES = 4
DEFAULT_SEQ_LEN = 256

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
# Files of the source that describe its *unquantized* weights: never copied over the export.
WEIGHT_FILE_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "*.bin.index.json")
NEVER_COPY = ("config.json", "manifest.json", "log.txt")  # log.txt: a build stage's library log (pipeline.build.logs)


HINT = "fix the recipe's [quantize] options or the input model"


class GroupSizeError(RaipackError):
    """The group size does not divide the input width of some layers (carries them, for the "auto" choice and the tests)."""

    def __init__(self, message: str, group_size: int, offenders: list[tuple[str, int]]):
        super().__init__(message, HINT)
        self.group_size = group_size
        self.offenders = offenders


# --------------------------------------------------------------------------- runtime settings


def _cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
MMAP_THRESHOLD = 1 << 30  # 1 GiB: AWQ's largest temporaries stay below it
TRIM_THRESHOLD = (1 << 31) - 1  # mallopt takes an int
TOP_PAD = 1 << 28


def runtime_env(threads: int | None = None) -> dict[str, str]:
    """Environment for a process that runs Quark on CPU (measured: docs/measurements/quantize.md).

    Pass it to a subprocess that runs the stage: the OpenMP and glibc variables are read
    once at start-up. ``apply_runtime_settings`` gets the same effect inside an already
    running process (mallopt through ctypes, torch thread count).
    """
    n = str(threads or _cpu_count())
    return {
        "OMP_NUM_THREADS": n,
        "MKL_NUM_THREADS": n,
        # Idle OpenMP workers sleep instead of spinning: on a shared 2-core machine spinning
        # workers burn the core another process (or our own other thread) needs.
        "OMP_WAIT_POLICY": "PASSIVE",
        # glibc malloc: serve large blocks from the heap and keep freed memory instead of
        # mmap/munmap per allocation. AWQ's clipping search allocates and frees tensors of
        # hundreds of MB in a tight loop; otherwise every one is a fresh mapping whose pages
        # the kernel zeroes again (the high system time the issue measured).
        "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
        "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
        "MALLOC_TOP_PAD_": str(TOP_PAD),
        # Quark's own switch (read when quark is imported): skip torch.compile of its
        # fake-quantize kernel. Same per-layer speed on CPU, saves the ~4 s compile per
        # process and the need for a working inductor C++ toolchain.
        "QUARK_DISABLE_COMPILE": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def _libc() -> Any:
    import ctypes
    import ctypes.util

    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def apply_runtime_settings(threads: int | None = None) -> dict[str, Any]:
    """Apply the runtime settings inside this process; returns what was applied.

    Missing ``runtime_env`` variables go into ``os.environ`` (OpenMP honours them only if
    torch is imported afterwards; child processes always do); glibc's allocator is tuned
    with ``mallopt``; torch gets the thread count and flush-denormal mode.
    """
    env = runtime_env(threads)
    torch_loaded = "torch" in sys.modules
    for key, value in env.items():
        os.environ.setdefault(key, value)
    libc = _libc()
    mallopt = False
    if libc is not None:
        mallopt = all(
            libc.mallopt(param, value) == 1
            for param, value in (
                (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                (_M_TOP_PAD, TOP_PAD),
            )
        )
    import torch

    n = int(threads or int(os.environ.get("OMP_NUM_THREADS") or env["OMP_NUM_THREADS"]))
    torch.set_num_threads(n)
    denormal = bool(torch.set_flush_denormal(True))
    return {
        "torch_threads": torch.get_num_threads(),
        "flush_denormal": denormal,
        "mallopt": mallopt,
        "omp_env_effective": not torch_loaded,
        "env": env,
    }


def release_memory() -> None:
    """Give the memory the tuned allocator kept back to the system (after a run)."""
    import gc

    gc.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


# --------------------------------------------------------------------------- cheap checks


def _read_config(model_config_or_dir: Any) -> dict[str, Any]:
    if isinstance(model_config_or_dir, Mapping):
        return dict(model_config_or_dir)
    if hasattr(model_config_or_dir, "to_dict"):  # transformers PretrainedConfig
        return model_config_or_dir.to_dict()
    path = Path(model_config_or_dir)
    if path.is_dir():
        path = path / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RaipackError(f"{path}: not found; expected a Hugging Face model folder with config.json", HINT) from None
    except json.JSONDecodeError as exc:
        raise RaipackError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}", HINT) from None


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    # multimodal wrappers keep the decoder's sizes in text_config
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
        return cfg["text_config"]
    return cfg


def linear_shapes(cfg: dict[str, Any]) -> list[tuple[str, int, int]] | None:
    """``(name, in_features, out_features)`` of every linear layer, from config.json alone.

    Known for Llama-, Mistral-, Qwen2/3- and Phi3-shaped decoders; ``None`` for others.
    """
    c = _text_config(cfg)
    model_type = c.get("model_type") or cfg.get("model_type")
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers")
    if any(not isinstance(c.get(k), int) for k in keys):
        return None
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    heads, layers = c["num_attention_heads"], c["num_hidden_layers"]
    kv = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or hidden // heads
    vocab = c.get("vocab_size") or 0
    if model_type in ("llama", "mistral", "qwen2", "qwen3", "granite", "olmo2", "smollm3"):
        per_layer = [
            ("self_attn.q_proj", hidden, heads * head_dim),
            ("self_attn.k_proj", hidden, kv * head_dim),
            ("self_attn.v_proj", hidden, kv * head_dim),
            ("self_attn.o_proj", heads * head_dim, hidden),
            ("mlp.gate_proj", hidden, inter),
            ("mlp.up_proj", hidden, inter),
            ("mlp.down_proj", inter, hidden),
        ]
    elif model_type == "phi3":
        per_layer = [
            ("self_attn.qkv_proj", hidden, (heads + 2 * kv) * head_dim),
            ("self_attn.o_proj", heads * head_dim, hidden),
            ("mlp.gate_up_proj", hidden, 2 * inter),
            ("mlp.down_proj", inter, hidden),
        ]
    else:
        return None
    shapes = [(f"model.layers.{i}.{n}", fi, fo) for i in range(layers) for n, fi, fo in per_layer]
    shapes.append(("lm_head", hidden, vocab))
    return shapes


def _linear_shapes_from_meta_model(cfg: dict[str, Any]) -> list[tuple[str, int, int]]:
    """Fallback for other architectures: build the model on the meta device (no weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    return [
        (name, m.in_features, m.out_features) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)
    ]


def _is_excluded(name: str, exclude: Iterable[str]) -> bool:
    # the same rule as Quark's: exact module name or fnmatch pattern
    return any(name == p or fnmatch.fnmatch(name, p) for p in exclude)


def check_group_size(
    model_config_or_dir: Any, group_size: int, exclude: Iterable[str] = ("lm_head",)
) -> list[tuple[str, int]]:
    """Layers whose ``in_features`` the group size does not divide, as ``(name, in_features)``.

    Takes a model folder, a config.json path, a config dict or a transformers config.
    Computed from config.json for the common decoder shapes; other architectures are
    built on the meta device (no weights loaded). An empty list means the size works.
    """
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise RaipackError(f"group size must be a positive integer, got {group_size!r}", HINT)
    cfg = _read_config(model_config_or_dir)
    shapes = linear_shapes(cfg)
    if shapes is None:
        shapes = _linear_shapes_from_meta_model(cfg)
    exclude = tuple(exclude)
    return [(name, fi) for name, fi, _ in shapes if not _is_excluded(name, exclude) and fi % group_size]


def _summarize(offenders: Sequence[tuple[str, int]], limit: int = 6) -> str:
    """'mlp.down_proj (in 1536) in 30 layers, ...' instead of one entry per decoder layer."""
    groups: dict[tuple[str, int], list[str]] = {}
    for name, width in offenders:
        parts = name.split(".")
        key = ".".join(parts[3:]) if len(parts) > 3 and parts[2].isdigit() else name
        groups.setdefault((key, width), []).append(name)
    items = []
    for (key, width), names in groups.items():
        where = names[0] if len(names) == 1 else f"{key} in {len(names)} layers"
        items.append(f"{where} (in_features {width})")
    more = f", and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def resolve_group_size(
    model_config_or_dir: Any, group_size: GroupSize, exclude: Iterable[str] = ("lm_head",)
) -> tuple[int, str | None]:
    """The group size to use and a warning (or ``None``); raises ``GroupSizeError``.

    ``"auto"`` picks the largest of 128/64/32 that divides every quantized layer's width.
    """
    exclude = tuple(exclude)
    if group_size == "auto":
        for g in GROUP_SIZES:
            if not check_group_size(model_config_or_dir, g, exclude):
                if g == GROUP_SIZES[0]:
                    return g, None
                offenders = check_group_size(model_config_or_dir, GROUP_SIZES[0], exclude)
                return g, (
                    f"group size {GROUP_SIZES[0]} does not divide {_summarize(offenders)}; "
                    f"using group size {g} (AMD's recipes use {GROUP_SIZES[0]})"
                )
        offenders = check_group_size(model_config_or_dir, GROUP_SIZES[-1], exclude)
        raise GroupSizeError(
            f"no supported group size ({', '.join(map(str, GROUP_SIZES))}) divides the input width of "
            f"{_summarize(offenders)}; exclude those layers or use another model",
            GROUP_SIZES[-1],
            offenders,
        )
    if group_size not in GROUP_SIZES:
        raise RaipackError(
            f"group size {group_size!r} is not supported; expected one of {', '.join(map(str, GROUP_SIZES))} or 'auto'", HINT
        )
    offenders = check_group_size(model_config_or_dir, group_size, exclude)
    if offenders:
        working = [g for g in GROUP_SIZES if not check_group_size(model_config_or_dir, g, exclude)]
        hint = f"use group size {working[0]} (or 'auto')" if working else "exclude those layers"
        raise GroupSizeError(
            f"group size {group_size} does not divide the input width of {_summarize(offenders)}; {hint}",
            group_size,
            offenders,
        )
    return group_size, None


def check_source_dir(src_dir: Path) -> list[str]:
    """Refuse folders without safetensors weights; returns warnings (e.g. ignored pickles)."""
    src_dir = Path(src_dir)
    if not (src_dir / "config.json").is_file():
        raise RaipackError(f"{src_dir}: no config.json; expected a Hugging Face model folder", HINT)
    pickles = sorted(p.name for p in src_dir.iterdir() if p.is_file() and p.suffix in PICKLE_SUFFIXES)
    safetensors = sorted(p.name for p in src_dir.glob("*.safetensors"))
    if not safetensors:
        if pickles:
            raise RaipackError(
                f"{src_dir}: only pickle checkpoints ({', '.join(pickles)}); raipack loads safetensors only, "
                "because unpickling runs arbitrary code. Convert them first, e.g. "
                "AutoModelForCausalLM.from_pretrained(dir).save_pretrained(new_dir, safe_serialization=True) "
                "in a sandbox you trust", HINT
            )
        raise RaipackError(f"{src_dir}: no *.safetensors weights found", HINT)
    if pickles:
        return [f"ignoring pickle files in {src_dir}: {', '.join(pickles)} (safetensors are used)"]
    return []


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


# --------------------------------------------------------------------------- measurement


def _reset_peak_rss() -> bool:
    try:  # Linux >= 4.0: "5" resets VmHWM, the peak resident set size
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("amd-quark", "torch", "transformers"):
        try:
            out[dist.replace("amd-", "")] = version(dist)
        except PackageNotFoundError:
            out[dist.replace("amd-", "")] = "missing"
    return out


# --------------------------------------------------------------------------- files


def _copy_missing_files(src_dir: Path, out_dir: Path) -> list[str]:
    """Copy every source file Quark's export did not write, except the source weights."""
    copied = []
    for entry in sorted(src_dir.iterdir()):
        name = entry.name
        if name.startswith(".") or name in NEVER_COPY or (out_dir / name).exists():
            continue
        if entry.is_file() and (
            any(fnmatch.fnmatch(name, p) for p in WEIGHT_FILE_PATTERNS) or entry.suffix in PICKLE_SUFFIXES
        ):
            continue
        if entry.is_dir():
            shutil.copytree(entry, out_dir / name, symlinks=False)
        elif entry.is_file():
            shutil.copy2(entry, out_dir / name)
        else:
            continue
        copied.append(name)
    return copied


# transformers 5 saves rotary settings as `rope_parameters`; published checkpoints (and the tools that read
# packages: AMD's model_generate, older transformers) use these keys, so the source's own values are kept.
SOURCE_KEYS_KEPT = ("rope_scaling", "rope_theta", "original_max_position_embeddings")


def _fix_config(out_dir: Path, src_cfg: dict | None = None) -> dict[str, Any]:
    path = out_dir / "config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    for key in SOURCE_KEYS_KEPT:
        if key in (src_cfg or {}) and key not in cfg:
            cfg[key] = src_cfg[key]
    qc = cfg.get("quantization_config")
    if not isinstance(qc, dict) or qc.get("quant_method") != "quark":
        raise RaipackError(f"{path}: Quark's export wrote no quark quantization_config", HINT)
    if not qc.get("kv_cache_quant_config"):
        qc["kv_cache_quant_config"] = {}
    cfg.pop("_name_or_path", None)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return qc


def _quantized_tensor_names(out_dir: Path) -> list[str]:
    from safetensors import safe_open

    names = []
    for f in sorted(out_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            names += [k[: -len(".weight_scale")] for k in st.keys() if k.endswith(".weight_scale")]
    return sorted(names)


# --------------------------------------------------------------------------- the stage body


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
    if algorithm not in ALGORITHMS:
        raise RaipackError(f"algorithm {algorithm!r} is not supported; expected one of {', '.join(ALGORITHMS)}", HINT)
    if dtype not in DTYPES:
        raise RaipackError(f"dtype {dtype!r} is not supported; expected one of {', '.join(DTYPES)}", HINT)
    exclude = list(exclude_layers)

    # -- cheap checks, before torch is even imported
    warns = check_source_dir(src_dir)
    cfg = _read_config(src_dir)
    model_type = _text_config(cfg).get("model_type") or cfg.get("model_type")
    chosen, warning = resolve_group_size(cfg, group_size, exclude)
    if warning:
        warns.append(warning)  # the quantize stage prints it as one line
    if out_dir.resolve() == src_dir.resolve():
        raise RaipackError(f"{out_dir}: the output folder must differ from the source folder", HINT)

    # before quark is imported: some of its switches are read at import time
    runtime = apply_runtime_settings() if tune_runtime and device == "cpu" else {}
    from pipeline.core.quark_import import import_quark

    import_quark(**({"say": notify} if notify else {}))  # never hangs on a killed build's compile lock
    from quark.torch import LLMTemplate, ModelQuantizer, export_safetensors

    try:
        template = LLMTemplate.get(model_type)
    except ValueError:
        raise RaipackError(
            f"{src_dir}: Quark 0.13 has no template for model_type {model_type!r}; "
            f"supported: {', '.join(sorted(LLMTemplate.list_available()))}", HINT
        ) from None
    scheme = f"uint4_wo_{chosen}"
    qconfig = template.get_config(
        scheme=scheme,
        algorithm=None if algorithm == "rtn" else algorithm,
        kv_cache_scheme=None,
        exclude_layers=exclude,
    )

    peak_reset = _reset_peak_rss()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t_load = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(src_dir), trust_remote_code=False, local_files_only=True)
    calibration = None
    batches = None
    if algorithm != "rtn":  # tokenized before the weights are loaded: bad data fails fast
        from stages.quantize.calibration import DEFAULT_CALIBRATION, read_texts, tokenize_texts

        texts = calib_texts if calib_texts is not None else read_texts(DEFAULT_CALIBRATION)
        source = "calib_texts" if calib_texts is not None else str(DEFAULT_CALIBRATION)
        samples = [s.to(device) for s in tokenize_texts(texts, tokenizer, num_samples, seq_len, source=source)]
        batches = _CalibrationBatches(samples, progress)
        calibration = {"num_samples": num_samples, "seq_len": seq_len, "tokens": num_samples * seq_len}

    model = AutoModelForCausalLM.from_pretrained(
        str(src_dir),
        dtype=getattr(torch, dtype),
        trust_remote_code=False,
        local_files_only=True,
        use_safetensors=True,
    )
    model.eval()
    model.to(device)
    load_seconds = time.perf_counter() - t_load

    from pipeline.core.output import output_folder

    with output_folder(out_dir) as tmp:
        t_q = time.perf_counter()
        with _report_layers(progress), torch.no_grad():
            quantizer = ModelQuantizer(qconfig)
            model = quantizer.quantize_model(model, batches)
            model = quantizer.freeze(model)
        quantize_seconds = time.perf_counter() - t_q
        t_e = time.perf_counter()
        export_safetensors(
            model, str(tmp), custom_mode="quark", weight_format="real_quantized", pack_method="reorder"
        )
        export_seconds = time.perf_counter() - t_e
        qc = _fix_config(tmp, cfg)
        copied = _copy_missing_files(src_dir, tmp)
        quantized = _quantized_tensor_names(tmp)
        files = sorted(p.name for p in tmp.iterdir())

    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    peak_rss = _peak_rss_bytes()
    del model, quantizer, batches
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
        "layers_quantized": len(quantized),
        "decoder_layers": _text_config(cfg).get("num_hidden_layers"),
        "calibration": calibration,
        "quant_method": qc.get("quant_method"),
        "copied_files": copied,
        "files": files,
        "warnings": warns,
        "seconds": round(time.perf_counter() - start, 2),
        "seconds_load": round(load_seconds, 2),
        "seconds_quantize": round(quantize_seconds, 2),
        "seconds_export": round(export_seconds, 2),
        "cpu_user_seconds": round(ru1.ru_utime - ru0.ru_utime, 2),
        "cpu_system_seconds": round(ru1.ru_stime - ru0.ru_stime, 2),
        "peak_rss_bytes": peak_rss,
        "peak_rss_scope": "this call" if peak_reset else "process lifetime",
        "runtime": {k: v for k, v in runtime.items() if k != "env"},
        "versions": _versions(),
    }
