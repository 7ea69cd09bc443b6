"""Run the build stages: inputs checked, stage runs into a staging folder,
outputs validated, manifest written, folder renamed into place.

Every stage output is a cache entry; killing the process at any moment leaves
either a complete entry (with its manifest) or a `.staging-*` folder that no
later run mistakes for output, and that the next build removes (raipack.builder.staging).
A rerun picks up after the last complete stage. Entries are sealed read-only and
checked on every hit (raipack.builder.cache); the package is a copy, never sharing a
byte of storage with the cache.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from raipack.builder import cache, handover, logs, stages, staging, swap
from raipack.builder.config import EvalConfig, config_dict, parse_config
from raipack.builder.context import BuildContext
from raipack.builder.crash import stage_crashed
from raipack.builder.inputs import check_model_dir
from raipack.builder.model_card import append_build_numbers
from raipack.builder.naming import package_name
from raipack.builder.placing import commit, link_stage_output, relocated
from raipack.builder.progress import Progress
from raipack.builder.recipe import Recipe
from raipack.core import lfs, manifest
from raipack.core.errors import RaipackError, UsageError
from raipack.core.memory import available, gib, peak_rss_bytes, reset_peak_rss
from raipack.core.output import atomic_write_text, copy_tree
from raipack.core.stage import Job
from raipack.evaluation.chain import gate as run_gate
from raipack.evaluation.chain import preflight
from raipack.evaluation.run import Request
from raipack.npu import profile as profiles
from raipack.npu.spec import Profile
from raipack.report.chain import document as quality_chain
from raipack.validate import validate


class StageFailed(RaipackError):
    """A stage ran but its output failed the checks, or it refused its input."""


class MemoryRefused(RaipackError):
    """A stage's memory estimate exceeds what the machine has free (exit code 1; --ignore-memory runs it anyway)."""


@dataclass
class StageResult:
    name: str
    status: str  # built | cached
    seconds: float
    key: str
    path: str
    report: dict = field(default_factory=dict)


@dataclass
class BuildResult:
    recipe: Recipe
    profile: Profile
    stages: list[StageResult]
    package: Path | None
    seconds: float
    findings: list = field(default_factory=list)
    evaluation: dict | None = None  # the accuracy gate's chain, when the recipe has [eval] tasks

    def report(self) -> dict:
        return {
            "format": "raipack-build-report",
            "format_version": 1,
            "model": self.recipe.model_name(),
            "profile": self.profile.id,
            "package": str(self.package) if self.package else None,
            "seconds": round(self.seconds, 2),
            "stages": [{"name": s.name, "status": s.status, "seconds": round(s.seconds, 2), "cache_key": s.key, "report": s.report} for s in self.stages],
            "findings": [f.to_dict() for f in self.findings],
            "tools": manifest.tool_versions(("torch", "amd-quark", "transformers", "onnx", "onnxruntime", "onnxruntime-genai")),
            **({"eval": self.evaluation} if self.evaluation else {}),
            **({"quality_chain": chain} if (chain := quality_chain([{"name": s.name, "report": s.report} for s in self.stages])) else {}),
        }


def plan(until: str | None, from_: str | None) -> tuple[list[str], str | None]:
    names = stages.order()
    for flag, value in (("--until", until), ("--from", from_)):
        if value is not None and value not in names:
            raise UsageError(f"{flag} {value!r} is not a stage", f"stages are: {', '.join(names)}")
    end = names.index(until) + 1 if until else len(names)
    if from_ and names.index(from_) >= end:
        raise UsageError(f"--from {from_} comes after --until {until}", "pick a --from stage before the --until stage")
    return names[:end], from_


@dataclass(frozen=True)
class BuildOptions:
    """How one build runs, apart from its recipe."""

    until: str | None = None  # the last stage to run
    from_: str | None = None  # rebuild from this stage on; earlier ones come from the cache (or the hand-over)
    force: bool = False  # rebuild every stage, ignoring the cache
    verify_cache: bool = False  # hash every cache hit against its manifest
    cache_root: Path | None = None  # default: cache.cache_root()
    inputs: handover.Handover | None = None  # a hand-over standing in for the stages before from_
    progress: Progress | None = None  # default: plain lines
    ignore_memory: bool = False  # run a stage whose memory estimate exceeds the free memory instead of refusing it


def build(recipe: Recipe, options: BuildOptions | None = None, /, **flags) -> BuildResult:
    """Run the stages. `flags` are BuildOptions fields set over `options` (build(recipe, until="fuse"));
    `inputs` (a hand-over, pipeline/builder/handover.py) stands in for the stages before `from_`."""
    opts = dataclasses.replace(options or BuildOptions(), **flags)
    start = time.perf_counter()
    progress = opts.progress or Progress("plain")
    profile = profiles.get(recipe.profile)
    inputs, force = opts.inputs, opts.force
    names, from_ = plan(opts.until, opts.from_ or (inputs.next if inputs else None))
    carried = handover.check_plan(inputs, names, from_) if inputs else []
    pkg_name = package_name(recipe, profile)
    out_root = Path(recipe.output)
    results: list[StageResult] = []
    model_stage, package_stage = stages.of_kind(stages.MODEL_KIND), stages.of_kind(stages.PACKAGE_KIND)
    model_dir = check_model_dir(Path(recipe.model), recipe.trust_remote_code) if recipe.model is not None else None  # before the output folder is made: a refused model leaves nothing behind
    _check_output_location(out_root)
    # a hand-over build runs nothing before --from; the [eval] table's tasks are checked now, run after the stages
    first, gate = (names.index(from_) if inputs else 0), _gate_request(recipe)
    for name in names[first:]:  # what a later stage would refuse, refused before the first one spends minutes
        st = stages.get(name)
        if st.preflight is not None:
            st.preflight(parse_config(st.config, recipe.stages.get(name), f"[{name}]"), profile)
    root = opts.cache_root or cache.cache_root()
    ctx = BuildContext(recipe, profile, root, progress, opts.verify_cache, inputs, started=start, ignore_memory=opts.ignore_memory)
    if model_dir is not None:
        ctx.outputs[model_stage] = model_dir
    outputs = ctx.outputs
    staging.hold(root)  # before the sweep: no other build takes this one's folders for a dead one's
    try:
        staging.sweep_cache(root)
        forcing = force
        for name in names:
            if (name == model_stage and recipe.model is not None) or (names.index(name) < first and name not in carried):
                continue
            if name in carried:  # checked by digest when the hand-over was read
                results.append(_take_carried(ctx, name))
                continue
            if from_ == name:
                forcing = True
            st = stages.get(name)
            missing = [i for i in st.inputs if i not in outputs]
            if missing:
                raise UsageError(f"stage {name} needs the output of {missing[0]}, which this build did not produce", "drop --from, or run the earlier stages first")
            on_miss = partial(_not_cached, from_, name) if from_ and names.index(name) < names.index(from_) else None
            res = run_stage(st, ctx, force=forcing, on_miss=on_miss)
            outputs[name], ctx.reports[name] = Path(res.path), res.report
            results.append(res)
            progress.stage(name, res.status, res.seconds, res.report.get("summary", ""))
            link_stage_output(out_root, pkg_name, name, Path(res.path))
        package, findings = None, []
        # the accuracy gate ([eval] tasks), before the package is assembled: a refused build leaves none
        evaluation = _run_gate(gate, outputs, out_root / f"{pkg_name}.stages", progress) if gate and package_stage in outputs else None
        if package_stage in outputs:
            package, findings = _assemble(ctx, out_root / pkg_name, results, evaluation)
        return BuildResult(recipe, profile, results, package, time.perf_counter() - start, findings, evaluation)
    finally:
        staging.release(root)


def stage_key(st, cfg, profile: Profile, outputs: dict, rehash: bool = False) -> str:
    """The cache key of stage `st` with config `cfg` for `profile`, over its input folders (hashed again with `rehash`)."""
    digests = {i: cache.folder_digest(outputs[i], memo=not rehash) for i in st.inputs}
    return cache.key(st.name, st.version, {"config": config_dict(cfg), "profile": st.profile_part(profile.document())}, digests, manifest.tool_versions(st.tools))


def run_stage(st, ctx: BuildContext, *, force: bool = False, on_miss=None) -> StageResult:
    """One stage of `ctx`'s recipe, given its input folders (`ctx.outputs`, by stage name): a cache hit, or a
    build committed to the cache. `on_miss()` runs before a miss is built (it may refuse). build() and raipack
    batch (pipeline/batch/jobs.py) both run a stage through here."""
    cfg = parse_config(st.config, ctx.recipe.stages.get(st.name), f"[{st.name}]")
    ckey = stage_key(st, cfg, ctx.profile, ctx.outputs, rehash=ctx.verify_cache)
    t0 = time.perf_counter()
    hit = None if force else cache.lookup(st.name, ckey, ctx.cache_root, verify=ctx.verify_cache, warn=ctx.warn)
    if hit is None and on_miss is not None:
        on_miss()
    if hit is not None:
        path, report, status = hit, stored_report(hit), "cached"
    else:
        memory = memory_check(st, cfg, [ctx.outputs[i] for i in st.inputs] + ([Path(ctx.recipe.model)] if ctx.recipe.model else []), ctx.profile, ctx.ignore_memory)
        path, report, status = _run_stage(st, cfg, ctx, ckey, force, memory)
    return StageResult(st.name, status, time.perf_counter() - t0, ckey, str(path), report)


def assemble_package(ctx: BuildContext, results: list[StageResult]):
    """(package, findings): the package stage's output (in `ctx.outputs`) assembled into <output>/<package name>,
    as build() does at the end of its chain (raipack batch calls it once per matrix entry)."""
    return _assemble(ctx, Path(ctx.recipe.output) / package_name(ctx.recipe, ctx.profile), results)


def _not_cached(from_: str, name: str) -> None:
    raise UsageError(f"--from {from_}: the output of {name} is not in the cache", f"run the build without --from first (cache: {cache.cache_root()})")


def _gate_request(recipe: Recipe):
    """(lm-eval request, max_drop) of the recipe's [eval] table, its tasks checked; None without tasks."""
    cfg = parse_config(EvalConfig, recipe.eval, "[eval]")
    if not cfg.tasks:
        return None
    base = Path(recipe.path).resolve().parent if recipe.path else Path.cwd()
    req = Request(cfg.tasks, cfg.limit, cfg.num_fewshot, base / cfg.include_path if cfg.include_path else None, cfg.numerics)
    preflight(req)
    return req, cfg.max_drop


def _run_gate(gate, outputs: dict, keep: Path, progress) -> dict:
    return run_gate(gate[0], gate[1], outputs, keep, progress)


def _check_output_location(out_root: Path) -> None:
    try:
        out_root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"output folder {out_root} cannot be created: {exc.strerror or exc}", "choose another --output folder") from None
    if not os.access(out_root, os.W_OK | os.X_OK):
        raise UsageError(f"output folder {out_root} is not writable", "choose another --output folder")


def stored_report(path: Path) -> dict:
    doc = manifest.read(path) or {}
    return doc.get("report", {})


def memory_check(st, cfg, folders: list[Path], profile: Profile, ignore: bool = False) -> dict:
    """The stage's memory estimate (the registry's) against the free memory, before anything is staged: a refusal
    in one sentence with the numbers, unless `ignore`. Returns the report's `memory` record."""
    est = stages.memory(st.name, cfg, folders, profile)
    avail, source = available(est.device)
    record = {"estimate_bytes": est.bytes, "basis": est.basis, **est.details, "available_bytes": avail, "available_source": source}
    if avail is None or est.bytes <= avail:
        return record
    if ignore:
        return {**record, "ignored": True}
    where = f"{folders[0]}: " if folders else ""
    hint = (est.hint(avail) if est.hint else "close other programs, or build on a machine with more free memory") + "; --ignore-memory runs it anyway"
    raise MemoryRefused(f"{where}stage {st.name} needs about {gib(est.bytes)} of memory ({est.basis}) but only {gib(avail)} is available "
                        f"on {est.device} ({source})", hint)


def _run_stage(st, cfg, ctx: BuildContext, ckey: str, force: bool, memory: dict | None = None) -> tuple[Path, dict, str]:
    """Build the stage into a staging folder and commit it; (entry, report, "built"), or "cached" when another
    process committed the same key first (its entry wins, this one's folder is discarded)."""
    recipe, profile, outputs, cache_root = ctx.recipe, ctx.profile, ctx.outputs, ctx.cache_root
    final = cache.entry(st.name, ckey, cache_root)
    final.parent.mkdir(parents=True, exist_ok=True)
    work = final.parent / f".staging-{ckey}-{os.getpid()}"
    cache.remove(work)
    work.mkdir()
    job = Job(st, cfg, {i: outputs[i] for i in st.inputs}, work, profile, recipe, ctx.progress, dict(ctx.reports))
    try:
        try:
            reset_peak_rss()
            with logs.captured(job):  # the libraries' output goes to the stage's log.txt
                report = st.run(job) or {}
            if memory is not None:  # the estimate beside the measured peak (VmHWM of this process during run())
                report["memory"] = {**memory, "peak_rss_bytes": peak_rss_bytes()}
        except RaipackError:
            raise
        except Exception as exc:  # no sentence yet: one now, the traceback to a file (pipeline/builder/crash.py)
            raise stage_crashed(st.name, recipe, profile, exc) from exc
        report = relocated(report, work, final)  # the staging folder's name never outlives it
        manifest.mark_incomplete(work)  # after run(): a stage gets an empty folder
        lineage = {"inputs": [{"stage": i, "path": str(outputs[i]), "sha256": cache.folder_digest(outputs[i]), **_carried(ctx.inputs, i)} for i in st.inputs],
                   "stages": [{"name": st.name, "version": st.version, "cache_key": ckey}]}
        kind = report.pop("manifest_kind", None) or st.kind or st.name  # a stage may say its output is another kind of folder
        doc = manifest.describe(work, kind, stage={"name": st.name, "version": st.version, "config": config_dict(cfg)},
                                lineage=lineage, tools=manifest.tool_versions(st.tools), extra={"report": report, "target_profile": profile.id})
        _check_output(st, job, work, doc)
        with cache.committing(final):  # one writer of this key at a time: the first commit wins
            if not force and cache.lookup(st.name, ckey, cache_root) is not None:
                cache.remove(work)
                return final, stored_report(final), "cached"
            if final.exists():  # an older entry under the same key: incomplete (a killed build), or rebuilt with --force
                cache.remove(final)
            commit(work, final, doc)
    except BaseException:
        cache.remove(work)
        raise
    return final, report, "built"


def _take_carried(ctx: BuildContext, name: str) -> StageResult:
    """A stage output from the hand-over: an input of the later stages, listed in the report as carried."""
    c = ctx.inputs.outputs[name]
    ctx.outputs[name], ctx.reports[name] = c.path, stored_report(c.path)
    ctx.progress.stage(name, "carried", 0.0, f"from {ctx.inputs.folder}")
    return StageResult(name, "carried", 0.0, c.cache_key, str(c.path), ctx.reports[name])


def _carried(inputs, stage: str) -> dict:
    """What the lineage adds for an output carried in a hand-over: the hand-over file and the digest it was checked against."""
    return handover.lineage(inputs, stage) if inputs and stage in inputs.outputs else {}


def _check_output(st, job, folder: Path, doc: dict) -> None:
    profile = st.output_profile(job)
    if profile is None:  # a report, not a package: the stage checked its own results
        return
    result = _validate_with_manifest(folder, doc, profile)
    errors = [f for f in result.findings if f.severity == "error"]
    if errors:
        f = errors[0]
        where = f"{f.path}" + (f" [{f.pointer}]" if f.pointer else "")
        raise StageFailed(f"stage {st.name} wrote an output that fails its checks: {where}: {f.message}" + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""), f.hint)


def _validate_with_manifest(folder: Path, doc: dict, profile: str = "auto"):
    """Validate a staged folder as it will be once committed, its manifest
    included in memory only: a killed run never leaves a manifest behind."""
    return validate(folder, profile, virtual={manifest.NAME: doc, manifest.INCOMPLETE: None})


def _assemble(ctx: BuildContext, target: Path, results: list[StageResult], evaluation: dict | None = None):
    """Copy the output of the package stage next to its build report, validate, rename into place."""
    recipe, profile, root, inputs = ctx.recipe, ctx.profile, ctx.cache_root, ctx.inputs
    stage = stages.of_kind(stages.PACKAGE_KIND)
    fused = ctx.outputs[stage]
    prefix = f".{target.name}.staging-"
    staging.sweep_beside(target.parent, prefix, root)
    swap.recover(target, partial(staging.alive, root=root))
    work = target.parent / f"{prefix}{os.getpid()}"
    cache.remove(work)
    work.mkdir()
    manifest.mark_incomplete(work)
    try:
        copy_tree(fused, work, ignore=(manifest.NAME, logs.LOG_NAME))  # the entry's records stay with the cache
        draft = BuildResult(recipe, profile, results, target, time.perf_counter() - ctx.started, evaluation=evaluation)
        atomic_write_text(work / "report.json", json.dumps(draft.report(), indent=2) + "\n")
        if evaluation:
            atomic_write_text(work / "eval.json", json.dumps(evaluation, indent=2) + "\n")
        append_build_numbers(work / "README.md", draft.report(),  # the source model: base_model and license of the card
                             source=Path(recipe.model) if recipe.model else next((Path(r.path) for r in results if r.name == stages.of_kind(stages.MODEL_KIND)), None))
        lfs.write(work)  # the Hub's LFS rules, for the files as they are now (the manifest lists it)
        doc = manifest.describe(work, (manifest.read(fused) or {}).get("kind", "package"), lineage={"inputs": [{"stage": stage, "path": str(fused), "sha256": cache.folder_digest(fused)}],
                                "stages": [{"name": r.name, "version": stages.get(r.name).version, "cache_key": r.key, **_carried(inputs, r.name)} for r in results]},
                                tools=draft.report()["tools"], extra={"target_profile": profile.id})
        result = _validate_with_manifest(work, doc)
        errors = [f for f in result.findings if f.severity == "error"]
        if errors:
            raise StageFailed(f"the assembled package fails validation: {errors[0].path}: {errors[0].message}", errors[0].hint)
        from raipack.report.page import write_build_page  # late: tests stub it there (test_batch.py)

        page = write_build_page(work, json.loads((work / "report.json").read_text()), result.findings, result.profile, ctx.warn)
        doc["files"] = sorted(doc["files"] + ([page] if page else []), key=lambda f: Path(f["path"]).parts)
        manifest.put(work, doc)
        (work / manifest.INCOMPLETE).unlink()
        swap.replace_dir(work, target)  # the package name always holds a finished package
    except BaseException:
        cache.remove(work)
        raise
    return target, result.findings
