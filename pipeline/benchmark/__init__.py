"""`raipack bench`: a package's speed the way AMD publishes it (model_benchmark: prompt lengths,
generated tokens, time to first token, tokens per second, peak memory), with the runtime that
really ran named in every row.

- Prompts: the package's prompts.txt (written by the build, pipeline/runtime/prompts.py), each cut
  to exactly the asked length with the package's tokenizer; the held-out text where it has none.
  Every backend gets the same token ids.
- Backends: `reference` (raipack's reference runtime on the package), `oga` (onnxruntime-genai on
  the package's unfused export, found through the manifest's lineage in the build cache, or given
  with --export), `npu` (onnxruntime-genai with the RyzenAI provider, only where
  pipeline/runtime/readiness.py says the NPU can run the package here). By default
  the package and its export side by side, with the ratio of every figure.
- Numerics (`numerics`, e.g. ["float", "bfp16"]): the reference backend once per numerics; under
  bfp16 (pipeline/runtime/numerics.py) its rows are backend `reference-bfp16`, and its figures get
  a ratio against the float `reference` rows: the cost of the NPU's formats emulated on the CPU.
  Not given (None): the device's numerics (evaluation/targets.py device_numerics), bfp16 alone for a
  package of an NPU or hybrid target, whose rows then get their ratio to the export (`oga`).
- Each backend runs in a child process (pipeline/benchmark/child.py) started from an empty folder:
  its peak memory is its own, and nothing is imported from the current folder.
- Warm-up runs, then N runs per length; median, min and max of each figure.
- Refusals before anything runs or is written: a length that is not a positive whole number, or
  above the package's prompt limit (rai_config.json max_prompt_length of its release), or that
  leaves no room for the generated tokens (UsageError, exit 2); a backend that cannot run here
  (RaipackError, exit 1).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from raipack.benchmark.child import RESULT
from raipack.builder import cache, stages
from raipack.core import manifest
from raipack.core.errors import RaipackError, UsageError
from raipack.evaluation.targets import device_numerics
from raipack.runtime.numerics import check_mode, ready
from raipack.runtime.prompts import Tokens, defaults, prompt_ids, read_lines
from raipack.runtime.readiness import npu_readiness
from raipack.runtime.trust import PackageFiles
from raipack.validate import open_package

BACKENDS = ("reference", "oga", "npu")
FORMAT, FORMAT_VERSION = "raipack-bench", 1
CHILD_TIMEOUT_S = 6 * 3600


@dataclass
class Plan:
    package: Path
    lengths: list[int]
    gen: int
    runs: int
    warmup: int
    backends: list[tuple[str, Path]]  # (backend, the folder it runs)
    prompts: dict[int, list[int]] = field(default_factory=dict)
    prompt_source: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    env: dict = field(default_factory=dict)  # extra environment of the npu child


def parse_lengths(text: str) -> list[int]:
    """'2048,1024,512' -> [2048, 1024, 512]; UsageError unless every item is a positive whole number."""
    items = [t.strip() for t in str(text).split(",")]
    if not items or not all(t.isdigit() and int(t) > 0 for t in items):
        raise UsageError(f"-l/--lengths is {text!r}; expected positive whole numbers separated by commas, such as 2048,1024,512,256,128",
                         "give prompt lengths in tokens, e.g. -l 512,256,128")
    return list(dict.fromkeys(int(t) for t in items))


def prompt_limit(package: Path) -> tuple[int, int, str]:
    """(the longest prompt the package takes, its maximum length, where the limit comes from)."""

    ctx, _ = open_package(package)
    s, prof = ctx.settings, ctx.profile
    found = s.prompt_limit(prof, str(prof.release or ""))
    limit, source = found if found else (s.longest_prompt() or 0, "genai_config.json search.max_length")
    return s.prompt_cap(limit) if s.max_length else limit, s.max_length or limit, source


def choose_lengths(asked: list[int] | None, gen: int, limit: int, max_length: int, source: str, notes: list[str]) -> list[int]:
    """The lengths to run: asked ones all fit or UsageError; the defaults are cut to what fits, with a note."""
    fits = min(limit, max_length - gen)
    if asked:
        over = [n for n in asked if n > fits]
        if over:
            why = (f"above the package's prompt limit of {limit} tokens ({source})" if over[0] > limit
                   else f"too long to add {gen} generated tokens within the package's maximum length of {max_length}")
            raise UsageError(f"prompt length {over[0]} is {why}", f"ask for lengths up to {fits} tokens (-l), or fewer generated tokens (-g)")
        return asked
    lengths = [n for n in defaults()["lengths"] if n <= fits]
    if not lengths:
        raise UsageError(f"none of the default prompt lengths fits the package (prompt limit {limit}, maximum length {max_length}, {gen} generated tokens)",
                         f"ask for lengths up to {fits} tokens with -l")
    if len(lengths) < len(defaults()["lengths"]):
        notes.append(f"default lengths above {fits} tokens skipped (prompt limit {limit}, {source})")
    return lengths


def find_export(package: Path, root: Path | None = None) -> tuple[Path | None, str]:
    """(the unfused export the package was fused from, "") through manifest.json's lineage and the
    build cache, or (None, one line saying why not)."""

    doc = manifest.read(package)
    if doc is None:
        return None, f"{package / 'manifest.json'} is missing or incomplete, so the export it was fused from is unknown"
    name = stages.of_kind("oga")
    keys = [s.get("cache_key") for s in (doc.get("lineage") or {}).get("stages") or [] if isinstance(s, dict) and s.get("name") == name]
    if not keys or not isinstance(keys[0], str) or not keys[0].isalnum():
        return None, f"{package / 'manifest.json'} names no {name} stage in its lineage"
    entry = cache.entry(name, keys[0], root)
    if manifest.read(entry) is None or not (entry / "genai_config.json").is_file():
        return None, f"the {name} stage {keys[0]} of its lineage is not in the build cache ({entry})"
    return entry, ""


def npu_ready(package: Path, export: Path | None) -> tuple[dict | None, str]:
    """(the npu child's environment, "") when the NPU can run the package here, else (None, why not):
    pipeline/runtime/readiness.py's answer, the one smoke, eval and doctor get."""

    readiness = npu_readiness(package, [export] if export else [])
    return (readiness.child_env(), "") if readiness.ready else (None, readiness.reason)


@dataclass(frozen=True)
class Runs:
    """How each prompt length is measured."""

    gen: int = 128  # tokens generated after each prompt
    runs: int = 3  # timed runs (median, min, max)
    warmup: int = 1  # untimed runs first


def parse_numerics(text: str | None) -> list[str] | None:
    """'float,bfp16' -> ["float", "bfp16"]; UsageError for another name; None (not given): None, the device's."""

    if text is None:
        return None
    return list(dict.fromkeys(check_mode(t.strip()) for t in str(text).split(",") if t.strip())) or ["float"]


def make_plan(package: Path, lengths: list[int] | None, runs: Runs, backend: str | None = None, export: Path | None = None,
              numerics: list[str] | None = None) -> Plan:
    """Everything checked and settled before anything runs."""
    gen = runs.gen

    if numerics is not None:  # asked for: checked before the package is looked at
        numerics = ready(numerics)
    package = Path(package)
    if not package.is_dir():
        raise UsageError(f"{package} is not a package folder", "give the folder raipack build wrote (its last lines name it)")
    notes: list[str] = []
    if numerics is None and backend in (None, "reference"):  # the device's numerics: bfp16 for a package of an NPU target
        default, why = device_numerics(package)
        numerics = [default]
        notes += [why] if why else [f"reference backend under {default} numerics, the device's (--numerics float for the float graph)"] if default != "float" else []
    numerics = ready(numerics or ["float"])
    limit, max_length, source = prompt_limit(package)
    lengths = choose_lengths(lengths, gen, limit, max_length, source, notes)
    if export is None and backend in (None, "oga", "npu"):
        export, why = find_export(package)
        if export is None and backend != "npu":
            notes.append(f"export not found: {why}; " + ("measuring the package alone" if backend is None else "nothing to run on onnxruntime-genai"))
    if backend == "oga" and export is None:
        raise RaipackError(f"--backend oga needs the package's unfused export: {notes[-1]}", "pass --export DIR, the export stage's folder of the build")
    plan = Plan(package, lengths, gen, runs.runs, runs.warmup, [], notes=notes)
    if backend == "npu":
        env, why = npu_ready(package, export)
        if env is None:
            raise RaipackError(f"--backend npu cannot run on this machine: {why}", "install the Ryzen AI runtime and set RYZENAI_EP_PATH (raipack doctor says what is missing), or use --backend reference")
        plan.env, plan.backends = env, [("npu", package)]
    else:
        refs = [("reference" if n == "float" else f"reference-{n}", package) for n in numerics]
        plan.backends = [(b, f) for b, f in (*refs, ("oga", export)) if f is not None and backend in (None, b.split("-")[0])]
    _prompts(plan)
    return plan


def _prompts(plan: Plan) -> None:

    files = PackageFiles(plan.package)
    tokens = Tokens(files.path("tokenizer.json", "raipack bench (the package's tokenizer)"))
    name = defaults()["prompts_file"]
    lines = read_lines(files.path(name, name)) if name in files.scan.files else []
    if not lines:
        plan.notes.append(f"{plan.package / name} is missing: prompts made from raipack's held-out text")
    for n in plan.lengths:
        plan.prompts[n], plan.prompt_source[n] = prompt_ids(tokens, lines, n)


def run_child(job: dict, env: dict) -> dict:
    """One backend's measurements in a child process started from an empty folder."""

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix="raipack-bench-") as empty:
        try:
            proc = subprocess.run([sys.executable, "-m", "raipack.benchmark.child"], input=json.dumps(job), capture_output=True, text=True,
                                  errors="replace", cwd=empty, env=env, timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {"error": f"it did not finish within {CHILD_TIMEOUT_S} s"}
    results = [line[len(RESULT):] for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if not results:
        last = (proc.stderr.strip().splitlines() or [""])[-1][:300]
        return {"error": f"the measuring process ended without a result (exit code {proc.returncode}): {last}"}
    return json.loads(results[-1])


def spread(values: list[float], scale: float = 1.0) -> dict:
    """{"median", "min", "max"} of the runs, times `scale`, rounded for people."""
    vals = [v * scale for v in values]
    return {"median": round(statistics.median(vals), 2), "min": round(min(vals), 2), "max": round(max(vals), 2)}


def rows_of(backend: str, result: dict, plan: Plan) -> list[dict]:
    return [{"backend": backend, "ran_on": result["ran_on"], "prompt_tokens": r["prompt_tokens"], "gen_tokens": r["gen_tokens"], "runs": len(r["ttft_s"]),
             "ttft_ms": spread(r["ttft_s"], 1000.0), "tokens_per_s": spread(r["tokens_per_s"]), "peak_rss_mb": r["peak_rss_mb"],
             "peak_rss_scope": r["peak_rss_scope"], "prompt_source": plan.prompt_source.get(r["prompt_tokens"], "")} for r in result["rows"]]


def ratios(rows: list[dict], num: str = "reference", den: str = "oga") -> list[dict]:
    """num/den of every median figure, per prompt length both backends ran."""
    by = {(r["backend"], r["prompt_tokens"]): r for r in rows}
    out = []
    for (backend, n), a in by.items():
        b = by.get((den, n))
        if backend != num or b is None:
            continue
        out.append({"prompt_tokens": n, "of": f"{num}/{den}",
                    "ttft": _ratio(a["ttft_ms"]["median"], b["ttft_ms"]["median"]),
                    "tokens_per_s": _ratio(a["tokens_per_s"]["median"], b["tokens_per_s"]["median"]),
                    "peak_rss": _ratio(a["peak_rss_mb"], b["peak_rss_mb"])})
    return out


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


def machine() -> dict:
    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "")
    except OSError:
        pass
    import platform

    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    return {"cores": os.cpu_count(), "cpu": cpu or platform.processor() or platform.machine(), "load_average": load}


def bench(plan: Plan, runner=run_child) -> dict:
    """Runs every backend of the plan; the document `--format json` writes."""
    start_machine = machine()
    rows: list[dict] = []
    for backend, folder in plan.backends:
        kind, _, numerics = backend.partition("-")
        job = {"backend": kind, "numerics": numerics or "float", "folder": str(folder.resolve()), "prompts": {str(n): ids for n, ids in plan.prompts.items()},
               "gen": plan.gen, "runs": plan.runs, "warmup": plan.warmup, "max_length": max(plan.lengths) + plan.gen + 1}
        result = runner(job, plan.env if backend == "npu" else {})
        if "error" in result:
            raise RaipackError(f"the {backend} backend could not be measured on {folder}: {result['error']}",
                               "check the folder with raipack validate" + (" (and raipack run)" if backend == "reference" else ""))
        rows += rows_of(backend, result, plan)
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "package": str(plan.package), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": start_machine, "settings": {"lengths": plan.lengths, "gen_tokens": plan.gen, "runs": plan.runs, "warmup": plan.warmup},
            "rows": rows, "ratios": ratios(rows) + ratios(rows, "reference-bfp16", "reference") + _bfp16_vs_oga(rows), "notes": plan.notes}


def _bfp16_vs_oga(rows: list[dict]) -> list[dict]:
    """reference-bfp16/oga when the package ran under BFP16 alone (the default for an NPU package): the ratio to its export."""
    return [] if any(r["backend"] == "reference" for r in rows) else ratios(rows, "reference-bfp16", "oga")
