"""`raipack tune`: change a package's length settings in genai_config.json, safely.

Only genai_config.json is rewritten (plus a backup beside it, and, in a package raipack built, the
entries of manifest.json for both with a `tuned` record): search.max_length,
search.chunk_size, hybrid_opt_max_seq_length (a power of two) and
max_length_for_kv_cache where present. Values the package's compiled tiers, KV
buffer or Ryzen AI version cannot serve are refused before anything is written;
the candidate file is validated before the write and the package after it.
"""

from __future__ import annotations

import copy
import difflib
import fnmatch
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from raipack import __version__
from raipack.checks import run_checks
from raipack.checks.manifest import manifest_files
from raipack.core.errors import RaipackError, UsageError
from raipack.core.findings import Result
from raipack.core.hashing import sha256_file
from raipack.core.manifest import NAME as MANIFEST
from raipack.core.manifest import put as put_manifest
from raipack.core.output import atomic_write_bytes
from raipack.core.package import JSON_MAX_BYTES, JsonError, Package, ReadError, parse_json, role_of
from raipack.npu import detect as detection
from raipack.npu.settings import pow2_ceil, pow2_floor, sdk_version
from raipack.validate import open_package

GENAI = "genai_config.json"
RAI = "rai_config.json"
MAX_DEPTH = 64  # AMD's genai_config.json files nest 6 levels; deeper is not a config


class Refused(RaipackError):
    """The package cannot serve the requested values (exit code 1, nothing written)."""


@dataclass
class Plan:
    path: Path
    old_text: str
    new_text: str
    changes: list[tuple[str, object, object]]  # (setting, old, new)
    sdk: tuple[str, str]
    profile: str  # the package's profile, detected before the edit; the candidate and the result are checked against it
    reason: str
    notes: list[str] = field(default_factory=list)
    manifest: bool = False  # raipack's manifest.json records genai_config.json: apply() updates its entry

    @property
    def root(self) -> Path:
        return self.path.parent

    def diff(self) -> str:
        lines = difflib.unified_diff(self.old_text.splitlines(True), self.new_text.splitlines(True), f"a/{GENAI}", f"b/{GENAI}")
        return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def compiled_tiers(ctx, phase: str) -> list[int]:
    """Tiers the package is compiled for (pipeline/npu/settings.compiled_tiers)."""
    return ctx.settings.prefill if phase == "prefill" else ctx.settings.token


def plan(path: Path, max_length: int | None, max_prompt: int | None, chunk_size: int | None, sdk: str | None = None, profile: str = "auto") -> Plan:
    if max_length is None and max_prompt is None and chunk_size is None:
        raise UsageError("raipack tune needs at least one of --max-length, --max-prompt, --chunk-size", "e.g. raipack tune PACKAGE --max-length 8192")
    ctx, reason = open_package(path, profile)
    doc, old_text = _load(ctx)
    _check_rai_config(ctx)
    recorded = _recorded_genai(ctx)
    L = ctx.settings.as_dict()
    opts, where = ctx.options
    version = sdk_version(ctx.profile, sdk)
    ml = max_length or L["max_length"]
    cs = chunk_size or L["chunk_size"]
    if not ml:
        raise Refused(f"{GENAI} has no search.max_length to tune from", "pass --max-length")
    _check_token_tiers(ctx, ml, profile == "auto")
    prefill = compiled_tiers(ctx, "prefill")
    _check_chunk_size(L, opts, chunk_size, cs, ml, prefill)
    prompt = _prompt_length(ctx, L, version, max_prompt, ml)
    new = copy.deepcopy(doc)
    search = new.setdefault("search", {})
    changes = []

    def put(name, container, key, value):
        old = container.get(key)
        if old != value:
            container[key] = value
            changes.append((name, old, value))

    put("search.max_length", search, "max_length", ml)
    if chunk_size is not None:
        put("search.chunk_size", search, "chunk_size", chunk_size)
    kv = ml if "max_length_for_kv_cache" in opts else None
    if kv is not None:
        put("max_length_for_kv_cache", _container(new, where["max_length_for_kv_cache"]), "max_length_for_kv_cache", str(kv))
    if "hybrid_opt_max_seq_length" in opts:
        seq = _seq_length(ctx, ml, cs if L["chunked"] else None, prompt, kv, prefill)
        put("hybrid_opt_max_seq_length", _container(new, where["hybrid_opt_max_seq_length"]), "hybrid_opt_max_seq_length", str(seq))
    new_text = dump_like(new, old_text)
    p = Plan(ctx.pkg.root / GENAI, old_text, new_text, changes, version, ctx.profile.id, reason, manifest=recorded)
    after = _prevalidate(ctx, new, version[0], recorded)
    if profile == "auto":
        _note_profile_change(p, after, reason)
    return p


def _recorded_genai(ctx) -> bool:
    """Whether raipack's manifest.json records genai_config.json; then the file must still be the one
    the build wrote (its sha256), so that tune never blesses an edit made after the build."""
    entry = manifest_files(ctx).get(GENAI)
    if entry is None:
        return False
    m = ctx.pkg.try_json(MANIFEST)
    if not (isinstance(m, dict) and m.get("format") == "raipack-manifest" and m.get("complete") is True):
        raise Refused(f"{ctx.pkg.root / MANIFEST} lists {GENAI} but is not a complete raipack manifest, so tune cannot keep it up to date", "rebuild the package (raipack build), or remove manifest.json from a copy you tune")
    if entry.get("sha256") != sha256_file(ctx.pkg.root / GENAI):
        raise Refused(f"{ctx.pkg.root / GENAI} does not match the sha256 {MANIFEST} records for it: it was edited after the build", "rebuild the package, or restore the file the build wrote, then tune")
    return True


def _check_chunk_size(L: dict, opts: dict, chunk_size: int | None, cs: int | None, ml: int, prefill: list[int]) -> None:
    """--chunk-size is a compiled prefill tier of a package with chunked prefill; the chunk fits max_length."""
    if chunk_size is not None:
        if prefill and chunk_size not in prefill:
            raise Refused(f"--chunk-size {chunk_size} is not a prefill tier the package is compiled for ({', '.join(map(str, prefill))})", "choose one of those tiers")
        if not L["chunked"]:
            raise Refused(f"--chunk-size {chunk_size} needs chunked prefill, but option hybrid_opt_chunk_context is {opts.get('hybrid_opt_chunk_context', 'missing')!r} in {GENAI}", "set hybrid_opt_chunk_context to \"1\" first (a RyzenAI option)")
    if cs and cs > ml:
        raise Refused(f"chunk size {cs} is above max_length {ml}", "use a chunk size at most --max-length")


def _prompt_length(ctx, L: dict, version: tuple[str, str], max_prompt: int | None, ml: int) -> int:
    """The prompt length to plan for: --max-prompt, or the release's limit capped at max_length; refused
    when it exceeds either, or when rai_config.json's max_prompt_length exceeds max_length."""
    limit = ctx.settings.prompt_limit(ctx.profile, version[0])
    if limit is None:
        raise UsageError(f"--sdk-version {version[0]}: neither rai_config.json nor profile {ctx.profile.id} gives a max_prompt_length for it", f"choose one of: {', '.join(sorted({**ctx.profile.max_prompt_length, **L['max_prompt']}))}")
    prompt = max_prompt or min(limit[0], ml)
    if prompt > limit[0]:
        raise Refused(f"--max-prompt {prompt} is above the {limit[0]} tokens Ryzen AI {version[0]} allows ({limit[1]})", "lower --max-prompt, or name a newer release with --sdk-version")
    if prompt > ml:
        raise Refused(f"max prompt {prompt} is above max_length {ml}: such a prompt leaves no room for an answer", "raise --max-length or lower --max-prompt")
    over = {v: n for v, n in L["max_prompt"].items() if n > ml}
    if over:
        raise Refused(f"--max-length {ml} is below rai_config.json's max_prompt_length {max(over.values())} (Ryzen AI {', '.join(sorted(over))}), which this command does not change", f"use --max-length {max(over.values())} or more")
    return prompt


def _note_profile_change(p: Plan, after, reason: str) -> None:
    """With `--profile auto`, a note when the edited package would be detected as another profile."""
    found = detection.detect(after)
    now = found.profile.id if found else "oga-export"
    if now != p.profile:
        p.reason = f"detected before the edit: {reason}"
        p.notes.append(f"note: with these settings `--profile auto` takes this package for profile {now}, no longer {p.profile}; pass --profile {p.profile} to later tune and validate runs (to undo this change, too)")


def _load(ctx) -> tuple[dict, str]:
    """genai_config.json parsed (by the package's capped JSON reader) and as text."""
    path = ctx.pkg.root / GENAI
    if GENAI not in ctx.pkg.files:
        scanned = [f for f in ctx.pkg.scan_findings if f.path == GENAI]
        if scanned:  # a special file, or a symlink leaving the package: refused by the scan, never opened
            raise Refused(f"{path} {scanned[0].message}; expected the package's own genai_config.json", scanned[0].hint)
        raise RaipackError(f"{path} is missing: there is nothing to tune", "tune a package folder that holds genai_config.json")
    try:
        doc = ctx.pkg.json(GENAI)
        text = ctx.pkg.read_bytes(GENAI, JSON_MAX_BYTES, "JSON config").decode("utf-8-sig")  # for the diff and the indent
        same = parse_json(text)[0] == doc
    except ReadError as exc:
        raise Refused(f"{path} {exc}; expected the package's genai_config.json", exc.hint or "run `raipack validate` on the package first") from None
    except UnicodeDecodeError:
        same = False
    if not same:
        raise RaipackError(f"{path} changed while raipack tune was reading it", "run raipack tune again")
    if not isinstance(doc, dict):
        raise Refused(f"{path} is not a JSON object; expected genai_config.json's settings", "run `raipack validate` on the package first")
    depth = json_depth(doc)
    if depth > MAX_DEPTH:
        raise Refused(f"{path} is nested {depth} levels deep; expected a genai_config.json of at most {MAX_DEPTH} levels", "check that the right file was placed here")
    if not isinstance(doc.get("search", {}), dict):
        raise Refused(f"{path}: search is not a JSON object; expected genai_config.json's search settings", "run `raipack validate` on the package first")
    dups = ctx.pkg.duplicate_keys(GENAI)
    if dups:
        raise Refused(f"{path} holds key {_show(dups[0].key)} {len(dups[0].values)} times in the object at {dups[0].pointer or '/'}; rewritten, it would keep only the last value", "remove the duplicates (raipack validate names them), then tune again")
    return doc, text


def json_depth(value) -> int:
    """How deeply a parsed JSON value nests (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _check_rai_config(ctx) -> None:
    """rai_config.json's max_prompt_length, which tune checks prompts against, holds whole numbers."""
    if RAI not in ctx.pkg.files:
        return
    path = ctx.pkg.root / RAI
    try:
        doc = ctx.pkg.json(RAI)
    except JsonError as exc:
        raise Refused(f"{path} {exc}; tune checks prompt lengths against its max_prompt_length", exc.hint) from None
    table = doc.get("max_prompt_length", {}) if isinstance(doc, dict) else None
    if not isinstance(table, dict):
        raise Refused(f"{path}: max_prompt_length is {_show(table)}; expected an object of Ryzen AI version to prompt length, such as {{\"1.8.0\": 4096}}", "fix rai_config.json (raipack validate names every problem), then tune again")
    for version, n in table.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise Refused(f"{path}: max_prompt_length[{_show(version)}] is {_show(n)}; expected a whole number of tokens, such as 4096", "fix rai_config.json (raipack validate names every problem), then tune again")


def _show(value) -> str:
    """A short, terminal-safe rendering of a JSON value for a message."""
    if isinstance(value, (dict, list)):
        return f"a JSON {'object' if isinstance(value, dict) else 'array'}"
    text = json.dumps(value)  # quotes strings and escapes control characters
    return text if len(text) <= 40 else text[:37] + "..."


def _check_token_tiers(ctx, ml: int, auto: bool = False) -> None:
    token = compiled_tiers(ctx, "token")
    top = max(token) if token else ctx.profile.context
    if top and ml > top:
        hint = f"use --max-length {top} or less"
        if auto and _detected_by_lengths(ctx):
            hint += f"; if the package was tuned down from a larger profile, name that profile with --profile (auto detection took it for {ctx.profile.id} from its search.max_length)"
        raise Refused(f"--max-length {ml} is above {top}, the largest token tier profile {ctx.profile.id} packages are compiled for", hint)
    cl = ctx.settings.context_length
    if cl and ml > cl:
        raise Refused(f"--max-length {ml} is above the model's context_length {cl} ({GENAI} /model/context_length)", f"use --max-length {cl} or less")


def _seq_length(ctx, ml: int, chunk: int | None, prompt: int, kv: int | None, prefill: list[int]) -> int:
    """hybrid_opt_max_seq_length: one NPU pass (the chunk, else the whole sequence),
    rounded up to a power of two, else down to the largest one the tiers and KV buffer allow."""
    want, need = (chunk, chunk) if chunk else (ml, prompt)
    tiers = prefill if chunk else compiled_tiers(ctx, "token")
    caps = [c for c in (max(tiers) if tiers else ctx.profile.context, kv) if c]
    cap = min(caps) if caps else None
    seq = pow2_ceil(want)
    if cap and seq > cap:
        seq = pow2_floor(cap)
    if seq < need:
        raise Refused(f"no power of two between {need} (one NPU pass) and {cap} (the largest tier or KV buffer) fits hybrid_opt_max_seq_length", "choose lengths that are powers of two, or a chunk size that is a tier")
    return seq


def _container(doc: dict, pointer: str) -> dict:
    node = doc
    for part in pointer.strip("/").split("/")[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def dump_like(doc: dict, original: str) -> str:
    """JSON text of `doc` with the original's indent and final newline, its characters written as themselves."""
    m = re.search(r"\n([ \t]+)\S", original)
    indent = None if m is None else ("\t" if m[1].startswith("\t") else len(m[1]))
    text = json.dumps(doc, indent=indent, ensure_ascii=False)  # onnxruntime-genai refuses every \\uXXXX escape (RP204)
    return text + "\n" if original.endswith("\n") else text


def _detected_by_lengths(ctx) -> bool:
    """Whether --profile auto chose the profile from search.max_length (not from the folder name)."""
    prof = ctx.profile
    by_name = any(fnmatch.fnmatchcase(ctx.pkg.name, pattern) for pattern in prof.detect.name_patterns)
    return not by_name and any(c.pointer == "/search/max_length" for c in prof.detect.content)


def _prevalidate(ctx, candidate: dict, version: str, manifest_updated: bool = False):
    """Refuse when the candidate file would fail a check the current one passes,
    both checked against the profile detected before the edit; the candidate's package.
    With `manifest_updated`, apply() rewrites the manifest's entry, so its size/hash checks are moot."""
    def errors(c):
        c.sdk_version = version
        found, _ = run_checks(c)
        return {(f.check_id, f.path, f.pointer): f for f in found if f.severity == "error"}

    after_ctx, _ = open_package(ctx.pkg.root, ctx.profile.id, virtual={GENAI: candidate})
    before, after = errors(ctx), errors(after_ctx)
    new = [f for key, f in after.items() if key not in before and not (manifest_updated and f.check_id in ("RP801", "RP802") and f.path == GENAI)]
    if new:
        f = new[0]
        raise Refused(f"the new settings would fail check {f.check_id}: {f.path} {f.message}", f.hint or "choose other values")
    return after_ctx.pkg


def backup_path(target: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    candidate, n = target.with_name(f"{target.name}.{stamp}.bak"), 1
    while candidate.exists():
        candidate, n = target.with_name(f"{target.name}.{stamp}-{n}.bak"), n + 1
    return candidate


def apply(p: Plan) -> Path | None:
    """Back up the file, then replace it atomically with the same mode and owner
    (through an in-package symlink: its target is replaced, the link stays);
    None when nothing changes."""
    if p.new_text == p.old_text:
        return None
    try:  # the package reader refuses a link leaving the package or a special file, unopened
        original = Package(p.root).read_bytes(GENAI, JSON_MAX_BYTES, "JSON config")
    except ReadError as exc:
        raise Refused(f"{p.path} {exc}; nothing was written", exc.hint) from None
    target = Path(os.path.realpath(p.path))
    if original.decode("utf-8-sig", "replace") != p.old_text:
        raise RaipackError(f"{p.path} changed while raipack tune was running", "run raipack tune again")
    mode = os.stat(target)
    backup = backup_path(p.path)
    atomic_write_bytes(backup, original, like=mode)
    new = p.new_text.encode("utf-8")
    atomic_write_bytes(target, new, like=mode)
    if p.manifest:
        _update_manifest(p, new, backup, original)
    return backup


def _update_manifest(p: Plan, new: bytes, backup: Path, original: bytes) -> None:
    """raipack's manifest.json, rewritten last: genai_config.json's new size and sha256, the backup listed
    beside it, and a `tuned` record of what changed (so the manifest says the package was tuned, and by whom)."""
    path = p.root / MANIFEST
    doc = json.loads(path.read_text("utf-8"))
    files = [e for e in doc["files"] if e.get("path") != backup.name]
    for entry in files:
        if entry.get("path") == GENAI:
            entry["size"], entry["sha256"] = len(new), hashlib.sha256(new).hexdigest()
    files.append({"path": backup.name, "size": len(original), "sha256": hashlib.sha256(original).hexdigest(), "role": role_of(backup.name)})
    doc["files"] = sorted(files, key=lambda e: e["path"])
    doc.setdefault("tuned", []).append({
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "by": f"raipack {__version__}", "file": GENAI, "backup": backup.name,
        "changes": [{"setting": name, "old": old, "new": value} for name, old, value in p.changes]})
    put_manifest(p.root, doc)


def revalidate(p: Plan):
    """Validate the written package against the profile it was tuned under."""

    ctx, _ = open_package(p.root, p.profile)
    ctx.sdk_version = p.sdk[0]
    findings, ran = run_checks(ctx)
    return Result(root=str(ctx.pkg.root), profile=ctx.profile.id, profile_reason=p.reason, findings=findings, checks_run=ran, files=len(ctx.pkg.files))
