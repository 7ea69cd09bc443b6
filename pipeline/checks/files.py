"""Checks on the package's files as files: presence, LFS pointers, paths, pickles, code."""

from __future__ import annotations

import fnmatch
import io
import posixpath
from dataclasses import replace
from functools import lru_cache

from raipack.checks.base import check
from raipack.core import lfs
from raipack.core.members import compact
from raipack.core.package import SCAN, ReadError
from raipack.data import load_data
from raipack.npu import catalog
from raipack.npu.layout import is_inside, weights_sibling
from raipack.npu.opened import cache_dir, opened
from raipack.npu.target import Target

WEIGHT_ROLES = ("external_data", "npu_weights", "npu_header", "safetensors", "graph", "metastate")


@check(SCAN, "package-scan")
def package_scan(ctx):
    """The folder can be walked: every entry is readable, no symlink leaves the
    package or loops, and no special file (device, socket, pipe) sits in it.
    Symlinks to folders are reported and not followed."""
    return ctx.pkg.scan_findings


@check("RP102", "lfs-pointer")
def lfs_pointer(ctx):
    """A file is a Git LFS pointer (recognised by its content, ~130 bytes of
    `version https://git-lfs...`/`oid`/`size`) where the real file belongs.
    The runtime then fails with "Protobuf parsing failed" or similar. The
    finding names the size the real file would have."""
    for fe in ctx.pkg.files.values():
        if fe.lfs:
            yield ctx.finding(
                fe.rel,
                f"is a Git LFS pointer ({fe.size} bytes) instead of the real {fe.lfs.size}-byte file",
                "run `git lfs install && git lfs pull` in the package's clone",
                pointer=fe.lfs.oid,
            )


@check("RP110", "hub-lfs-rule", "warning")
def hub_lfs_rule(ctx):
    """A file over 10 MiB, or a binary file over 1 MB, that no `.gitattributes`
    rule puts into Git LFS. The Hugging Face Hub refuses such a push ("Your push
    was rejected because it contains files larger than 10 MiB" / "... contains
    binary files", huggingface_hub #2666, #687), and AMD's Hub folders keep every
    such file in LFS (sources: `pipeline/data/hub.json`).
    Patterns are matched as git matches them (`pipeline/core/gitattributes.py`);
    the hint is the line to add. A warning; an error under `validate --for hub`. Not for the
    build's intermediate folders (source, Quark and OGA exports): raipack ships packages."""
    if ctx.profile.target is Target.INTERMEDIATE:  # a stage's output (a Quark or OGA folder) is no package to ship
        return
    try:
        attrs = lfs.attributes_of(ctx.pkg)
    except ReadError as exc:
        yield ctx.finding(lfs.NAME, str(exc), exc.hint or "check the file")
        return
    sizes = {rel: fe.size for rel, fe in ctx.pkg.files.items() if not fe.lfs and not fe.symlink}
    refused = [p for p in lfs.plan(sizes, attrs, lambda rel: lfs.is_binary(ctx.pkg, rel)) if p.refused]
    if len(refused) > 1:  # one finding on the file to edit, every file kept in `members`
        total = sum(p.size for p in refused) / 2**20
        yield replace(ctx.finding(lfs.NAME, f"{compact([p.path for p in refused])}: {len(refused)} files ({total:.1f} MiB) the Hub refuses outside Git LFS "
                                            f"(over 10 MiB, or binary and over 1 MB), and no rule of {lfs.NAME} puts them into LFS",
                                  f"add these lines to {lfs.NAME}: " + "; ".join(sorted({lfs.suggested_rule(p.path) for p in refused})[:5])),
                      members=tuple(p.path for p in refused))
        return
    for planned in refused:
        rule = attrs.rule_for(planned.path, "filter")
        why = f"; {rule.base + '/' if rule.base else ''}{lfs.NAME} line {rule.line} ({rule.pattern}) keeps it out" if rule else ""
        yield ctx.finding(planned.path, f"is {planned.size / 2**20:.1f} MiB, {planned.refused}{why}",
                          f"add this line to {lfs.NAME}: {lfs.suggested_rule(planned.path)}")


@check("RP103", "empty-file")
def empty_file(ctx):
    """A weights, graph or config file is empty (0 bytes): an interrupted copy
    or download. Files a real package ships empty (`pipeline/data/empty_files.json`:
    the `.super` and `.ctrlpkt` of AMD's 1.6 dd_metastate sets) are accepted."""
    empty_ok = [e["pattern"] for e in load_data("empty_files.json")["may_be_empty"]]
    for fe in ctx.pkg.files.values():
        if fe.size == 0 and (fe.role in WEIGHT_ROLES or fe.rel.endswith(".json")):
            if any(fnmatch.fnmatchcase(fe.rel.rsplit("/", 1)[-1], p) for p in empty_ok):
                continue
            yield ctx.finding(fe.rel, "is empty (0 bytes)", "copy or download the file again")


@check("RP104", "path-escape")
def path_escape(ctx):
    """Every file a config names (the decoder graph, the external data file,
    cache tensor files) is a relative path inside the package: no `..`, no
    absolute path, no drive letter."""
    for rel, pointer, value in referenced_paths(ctx):
        if not is_inside(value):
            yield ctx.finding(rel, f"{pointer} is {value!r}, a path that leaves the package", "name a file inside the package folder, relative to it", pointer)


def referenced_paths(ctx):
    """(file, JSON pointer, path) for every file name a config refers to."""
    genai = ctx.genai
    if isinstance(genai, dict):
        dec = genai.get("model", {}).get("decoder", {}) if isinstance(genai.get("model"), dict) else {}
        if isinstance(dec, dict) and isinstance(dec.get("filename"), str):
            yield "genai_config.json", "/model/decoder/filename", dec["filename"]
        opts, where = ctx.options
        for key in ("external_data_file", "custom_ops_library"):
            if isinstance(opts.get(key), str):
                yield "genai_config.json", where[key], opts[key]


@check("RP105", "pickle-weights", "warning")
def pickle_weights(ctx):
    """A pickle-based checkpoint (`pytorch_model.bin`, `*.pt`, `*.pkl`, a
    `.bin` that starts like a pickle). Loading one can run arbitrary code, so
    raipack never loads it; the build accepts safetensors only."""
    for fe in ctx.pkg.by_role("pickle"):
        if not fe.lfs:
            yield ctx.finding(fe.rel, "is a pickle-based checkpoint; raipack does not load it (loading can execute code)", "convert it to safetensors with a trusted tool, then remove it")


@check("RP106", "code-files", "warning")
def code_files(ctx):
    """The package carries code (`*.py`). raipack never imports or runs code
    from a package; a deployable package needs none. A shared library is
    RP113's error."""
    for fe in ctx.pkg.by_role("code"):
        if library_kind(ctx.pkg, fe) is None:
            yield ctx.finding(fe.rel, "is code shipped inside the package; raipack did not run it", "remove it unless the runtime documents that it needs it")


@check("RP113", "shared-library")
def shared_library(ctx):
    """A shared library inside the package, known by its name (`*.so`,
    `*.so.*`, `*.dll`, `*.dylib`, `*.pyd`) or, whatever its name, by its
    first bytes (ELF, PE, Mach-O; `pipeline/data/shared_libraries.json`;
    an ONNX external data file, read by its size only, only when a config
    names it as the library).
    A runtime that loads it (onnxruntime-genai loads the library
    `session_options.custom_ops_library` names) runs its code. AMD's
    packages ship none: the custom-op library comes with the Ryzen AI
    install, and the library the config names is not exempt."""
    named = (ctx.options[0] or {}).get("custom_ops_library")
    named = posixpath.normpath(named.replace("\\", "/")) if isinstance(named, str) and named else None
    for fe in ctx.pkg.files.values():
        kind = library_kind(ctx.pkg, fe, sniff=fe.rel == named or fe.role not in _library_spec()["not_sniffed_roles"])
        if kind is None:
            continue
        loads = "; genai_config.json names it as custom_ops_library, so onnxruntime-genai would load it with the model" if named == fe.rel else ""
        yield ctx.finding(fe.rel, f"is a shared library ({kind}) inside the package{loads}: loading it runs its code, and a package needs none "
                                  "(the custom-op library comes with the Ryzen AI install)",
                          "remove it, and name the Ryzen AI install's custom-op library in genai_config.json (an absolute path) if the release needs one")


def library_kind(pkg, fe, sniff: bool = True) -> str | None:
    """What makes `fe` a shared library ("named *.so", "ELF", "PE", "Mach-O"), or None; its first
    bytes are read only when `sniff`."""
    spec = _library_spec()
    name = fe.name.lower()
    pattern = next((p for p in spec["names"] if fnmatch.fnmatchcase(name, p)), None)
    if pattern:
        return f"named {pattern}"
    if not sniff or fe.lfs or fe.size < 4:
        return None
    small = pkg._small.get(fe.rel)  # the scan read small files whole: no second open
    try:
        if small is not None:
            return _magic(io.BytesIO(small), fe.size, spec)
        with pkg.open(fe.rel) as fh:
            return _magic(fh, fe.size, spec)
    except (OSError, ReadError):
        return None  # the scan (RP101) reports a file that cannot be read


@lru_cache(maxsize=1)
def _library_spec() -> dict:
    """pipeline/data/shared_libraries.json with its hex strings as bytes."""
    raw = load_data("shared_libraries.json")
    pe, fat = raw["pe"], raw["fat_mach_o"]
    return {"names": raw["names"], "not_sniffed_roles": tuple(raw["not_sniffed_roles"]["roles"]), "magic": {k: tuple(bytes.fromhex(m) for m in v) for k, v in raw["magic"].items()},
            "pe": {**pe, "mz": bytes.fromhex(pe["mz"]), "signature": bytes.fromhex(pe["signature"])},
            "fat_mach_o": {**fat, "magic": bytes.fromhex(fat["magic"])}}


def _magic(fh, size: int, spec: dict) -> str | None:
    head = fh.read(64)
    for kind, magics in spec["magic"].items():
        if head.startswith(magics):
            return kind
    fat = spec["fat_mach_o"]
    if head.startswith(fat["magic"]) and len(head) >= 8 and 0 < int.from_bytes(head[4:8], "big") <= fat["max_archs"]:
        return "Mach-O"
    pe = spec["pe"]
    if head.startswith(pe["mz"]) and len(head) >= pe["lfanew_at"] + 4:
        at = int.from_bytes(head[pe["lfanew_at"]:pe["lfanew_at"] + 4], "little")
        if at + 4 <= min(size, pe["lfanew_max"]):
            fh.seek(at)
            if fh.read(4) == pe["signature"]:
                return "PE"
    return None


# Opened by every loader whatever the configs say: the config itself (onnxruntime-genai's Config).
ALWAYS_OPENED = ("genai_config.json",)


def _named_by_configs(ctx) -> set[str] | None:
    """The files genai_config.json names for a loader (None when it cannot be read: then the
    profile's list is all raipack knows), with the external data file's weights sibling."""
    if not isinstance(ctx.genai, dict):
        return None
    names = {o.rel for o in opened(ctx.genai)}
    names |= {weights_sibling(n) for n in names if n.endswith(".pb.bin")}
    names |= {n + ".data" for n in names if n.endswith(".onnx")}  # the builder's external data file (RP702 checks the real one)
    return names


@check("RP107", "required-files")
def required_files(ctx):
    """Every file the profile requires is present (globs allowed), and of each
    group of alternatives (e.g. `cache/` or `.cache/`, `tokenizer.json` or
    `tokenizer.model`) at least one is there. A profile lists what a release
    usually ships: a missing file is an error where a loader opens it
    (`genai_config.json`; the files genai_config.json names, reported by
    RP109 and RP404 with their pointer; the tokenizer), and a warning where
    no config of the package names it (AMD's eager gpt-oss package names its
    decoder `model_npu_eager.onnx`, not `model.onnx`). When genai_config.json
    cannot be read, every required file is an error. The profile's
    recommended files are reported as warnings."""
    files = ctx.pkg.files
    prof = ctx.profile
    spec = prof.files

    def present(pattern: str) -> bool:
        return pattern in ctx.pkg.dirs or any(fnmatch.fnmatchcase(rel, pattern) for rel in files)

    named = _named_by_configs(ctx)
    for pattern in spec.required:
        if not present(pattern):
            what = "a file matching" if any(c in pattern for c in "*?[") else "the file"
            if named is None or pattern in ALWAYS_OPENED:
                yield ctx.finding(pattern, f"is missing: profile {prof.id} requires {what} {pattern!r}", "copy the complete package again (all files of the release)")
            elif pattern not in named:  # a file the configs name is RP109's (or RP404's) error, with the pointer
                yield ctx.finding(pattern, f"is missing: {prof.id} packages usually ship {what} {pattern!r}, but no config of this package names it for a loader",
                                  "nothing loads it here; add it if the release ships it", severity="warning")
    cache = cache_dir(ctx.genai, ctx.pkg.dirs)  # where dd_cache puts it, when that is not cache/ or .cache/
    for group in spec.required_one_of:
        if not any(present(p) for p in group) and not (cache and {"cache", ".cache"} & set(group)):
            yield ctx.finding(group[0], f"is missing: profile {prof.id} requires one of {', '.join(group)}", "copy the complete package again (all files of the release)")
    for pattern in spec.recommended:
        if not present(pattern):
            yield ctx.finding(pattern, f"is missing; profile {prof.id} packages usually carry it", "add it if the release ships it", severity="warning")


@check("RP108", "release-unknown", "warning")
def release_unknown(ctx):
    """The folder name states a Ryzen AI release (`<model>_rai_<release>_<variant>`, as AMD names
    its packages) that raipack's release catalog does not hold. The package is then checked
    against the profile detection chose (for a newer release, the newest known release of the
    same variant), whose rules need not be that release's: AMD's release notes say a package of
    one release does not run on another (1.7.1 → 1.8: "models from 1.7.1 are incompatible"), so
    a clean result says little. A warning: what fails is unknown, not known."""
    named = catalog.release_in_name(ctx.pkg.name)
    if named is None or catalog.entry(named[0]) is not None:
        return
    release, newest = named[0], catalog.newest()
    age = "newer than" if catalog.version_key(release) > catalog.version_key(newest) else "not in"
    yield ctx.finding(".", f"the folder name {ctx.pkg.name!r} names Ryzen AI {release}, {age} raipack's release catalog "
                           f"(newest {newest}); checked against profile {ctx.profile.id} (Ryzen AI {ctx.profile.release}), "
                           f"whose rules may not be {release}'s",
                      f"add Ryzen AI {release} to the release catalog (one entry, docs/profiles.md; RAIPACK_RELEASES names your copy), "
                      "or give --profile")
