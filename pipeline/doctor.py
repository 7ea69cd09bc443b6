"""`raipack doctor [PACKAGE]`: will this package run here, and if not, why?

The environment as pipeline/machine.py reads it, then the package against it: its Ryzen AI release
against the installed runtime's, what validation finds (error level), options that runtime has
deprecated, paths only one machine has, the prompt limit of the installed SDK, custom-op libraries it
names. Each problem is one finding with a code (DRnnn, documented in docs/doctor.md; a validation
error keeps its RPnnn id) and a fix. Nothing from the package is loaded or run.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from raipack import machine
from raipack.checks import run_checks
from raipack.core.errors import NothingToValidate, UsageError
from raipack.core.textsafe import safe, safe_tree
from raipack.npu import linux
from raipack.npu.settings import version_tuple
from raipack.npu.spec import Profile
from raipack.npu.target import Target
from raipack.runtime import probes
from raipack.runtime.provider import EP_ENV
from raipack.runtime.readiness import npu_readiness
from raipack.validate import open_package as scan

WINDOWS_PATH = re.compile(r"^[A-Za-z]:[\\/]|\\")  # a drive letter, or any backslash
PATH_KEYS = ("filename", "external_data_file", "custom_ops_library", "dd_root", "dd_cache", "ep_context_file_path", "config_file", "path")


@dataclass
class Problem:
    code: str
    severity: str  # error (will not run here) | warning (may not run as expected) | info
    message: str
    hint: str

    def line(self) -> str:
        return f"{self.severity.upper()} {self.code}: {self.message} — fix: {self.hint}"


@dataclass
class Report:
    environment: dict
    package: dict | None = None
    findings: list[Problem] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return not any(p.severity == "error" for p in self.findings)

    def to_dict(self) -> dict:
        return {"ready": self.ready, "environment": self.environment, "package": self.package, "findings": [asdict(p) for p in self.findings]}


# -- the environment -----------------------------------------------------------------------------

def environment(package: Path | None = None) -> tuple[dict, list[Problem]]:
    """What this machine has, and the problems it causes for `package` (None: for any NPU package).
    The NPU facts are pipeline/runtime/readiness.py's checks, every one asked: the answer smoke, bench
    and eval get. No provider library is loaded from the package."""

    genai, ort = machine.installed("onnxruntime_genai"), machine.installed("onnxruntime")
    release = machine.release_of(genai[1]) if genai else None
    readiness = npu_readiness(package, every=True)
    found, loads, known = (readiness.check(n) for n in ("provider_library", "library_loads", "ryzenai_provider"))
    env = {
        "platform": sys.platform,
        "onnxruntime_genai": {"distribution": genai[0], "version": genai[1]} if genai else None,
        "onnxruntime": {"distribution": ort[0], "version": ort[1]} if ort else None,
        "release": {k: release[k] for k in ("release", "confidence", "source")} if release else None,
        "ryzenai_provider": {"known": known.ok, "detail": known.detail},
        "provider_library": {"path": str(readiness.library) if readiness.library else None, "loads": loads.ok,
                             "detail": found.detail if readiness.library is None else loads.detail},
        "npu": readiness.npu,
        "sdk": probes.sdk_install(),
        "npu_readiness": {"ready": readiness.ready, "reason": readiness.reason},
    }
    package_check = readiness.check("package")
    problems = _npu_problems(env["npu"]) + _runtime_problems(env, genai) + _library_problems(env, EP_ENV)
    if package_check is not None and package_check.ok is False:
        problems.append(Problem("DR107", "warning", f"raipack's smoke, bench and eval will not try it on the NPU: {package_check.detail}",
                                "keep the package's genai_config.json to the RyzenAI provider and the libraries of the Ryzen AI install"))
    return env, problems


def _npu_problems(npu: dict) -> list[Problem]:
    if not npu["present"]:
        fix = {"linux": "run on a Ryzen AI (XDNA) machine with the amdxdna driver loaded (Linux 6.14 or later, or AMD's xdna-driver)",
               "win32": "install AMD's NPU driver (Ryzen AI installation guide) on a Ryzen AI machine"}.get(sys.platform, "run on a Ryzen AI machine with Windows or Linux")
        return [Problem("DR001", "error", f"no NPU here: {npu['detail']}", fix)]
    minimum = machine.releases()["npu_driver"]["minimum"]
    driver = npu.get("driver") or ""
    if re.fullmatch(r"[\d.]+", driver) and version_tuple(driver) < version_tuple(minimum):
        return [Problem("DR007", "warning", f"the NPU driver {driver} is older than {minimum}, the least Ryzen AI's OGA path is known to need",
                        "update the NPU driver from AMD's Ryzen AI page")]
    return []


def _runtime_problems(env: dict, genai) -> list[Problem]:
    if not genai:
        return [Problem("DR002", "error", "onnxruntime-genai is not installed in this Python environment",
                        "install the onnxruntime-genai of your Ryzen AI release (its installer, or the wheel it ships)")]
    out = []
    if env["release"] is None:
        out.append(Problem("DR003", "warning", f"onnxruntime-genai {genai[1]} ({genai[0]}) belongs to no Ryzen AI release raipack knows (pipeline/data/ryzenai_releases.json)",
                           "use the onnxruntime-genai your Ryzen AI release installs; a package runs only on its own release's runtime"))
    known, how = env["ryzenai_provider"]["known"], env["ryzenai_provider"]["detail"]
    if known is False:
        out.append(Problem("DR004", "error", f"onnxruntime-genai {genai[1]} does not know the RyzenAI provider: {how}",
                           "install the onnxruntime-genai of your Ryzen AI release (the public one before 0.12 has no RyzenAI provider)"))
    elif known is None:
        out.append(Problem("DR004", "warning", f"could not tell whether onnxruntime-genai {genai[1]} knows the RyzenAI provider: {how}",
                           "run `python -c \"import onnxruntime_genai\"` to see what fails"))
    return out


def _library_problems(env: dict, ep_env: str) -> list[Problem]:
    lib, sdk = env["provider_library"], env["sdk"]
    out = []
    if sdk["path"] and not sdk["exists"]:
        out.append(Problem("DR008", "warning", f"RYZEN_AI_INSTALLATION_PATH={sdk['path']} is no folder", "point it at the Ryzen AI install (its version folder), or unset it"))
    if lib["path"] is None:
        out.append(Problem("DR005", "error", lib["detail"],
                       f"install the Ryzen AI runtime and set {ep_env} to its libonnxruntime_providers_ryzenai library (absolute path), or RYZEN_AI_INSTALLATION_PATH to the install"))
    elif lib["loads"] is False:
        out.append(Problem("DR006", "error", lib["detail"],
                           "install the provider library of your Ryzen AI release for this platform, with its dependencies on the library path"))
    return out


# -- the package against it ----------------------------------------------------------------------

def open_package(path: Path):
    """(Context, why its profile) of the package at `path`; NothingToValidate (exit 3) if no package is there."""

    try:
        return scan(Path(path))
    except UsageError as exc:  # missing path, a file, unreadable: no package there
        raise NothingToValidate(str(exc), exc.hint) from exc


def check_package(opened, env: dict) -> tuple[dict, list[Problem]]:
    """The package's facts and its problems on this machine (`opened`: what open_package returned)."""

    ctx, reason = opened
    profile = ctx.profile
    release = profile.release
    needs = machine.release_entry(release) if release != "n/a" else None
    version = env["sdk"]["version"] or (env["release"] or {}).get("release")
    if version:
        ctx.sdk_version = version  # RP006 then measures the prompt limit of the Ryzen AI here
    findings, _ = run_checks(ctx)
    info = {"path": str(ctx.pkg.root), "profile": profile.id, "profile_reason": reason, "release": release,
            "target": profile.target.value, "needs": {k: needs[k] for k in ("onnxruntime_genai", "onnxruntime", "confidence", "source")} if needs else None}
    problems = _kind_problems(profile, release) + _release_problems(release, needs, env) + device_problems(release, env["npu"])
    problems += [Problem(f.check_id, "error", f"{f.path or '.'}: {f.message}", f.hint) for f in findings if f.severity == "error"]
    problems += [Problem("DR105", "warning", f.message, f.hint) for f in findings if f.check_id == "RP006"]
    problems += _config_problems(ctx, release, env) + _linux_problems(ctx, release, env)
    return info, problems


def _linux_problems(ctx, release: str, env: dict) -> list[Problem]:
    """On Linux: the edits AMD documents for running the release's (Windows-built) packages here."""

    if not env["platform"].startswith("linux"):
        return []
    stop = linux.refusal(ctx.profile)
    if stop is not None:
        return [Problem("DR110", stop[0], stop[1], stop[2])]
    out = []
    for edit in linux.pending(ctx.pkg, release):
        where = "; the value names your install (deployment/ copied into the folder you run from)" if edit.install_path else ""
        out.append(Problem("DR110", "error", f"{edit.file}: {edit.what} ({edit.why}{where})", f"raipack tune --platform linux {ctx.pkg.root}"))
    return out


def _kind_problems(profile: Profile, release: str) -> list[Problem]:
    if profile.target is Target.REFERENCE:
        return [Problem("DR100", "error", f"built by raipack's reference backend (profile {profile.id}): its NPU files are raipack's open formats, which AMD's runtime cannot load",
                        "rebuild with --backend ryzenai-sdk on a machine with AMD's model_generate, or run it on the CPU with `raipack run`")]
    if release == "n/a":
        return [Problem("DR100", "error", f"not an NPU package (profile {profile.id}): it has no RyzenAI post-processing",
                        "fuse it for a Ryzen AI release first (`raipack build --from fuse`)")]
    return []


def _release_problems(release: str, needs: dict | None, env: dict) -> list[Problem]:
    if release == "n/a":
        return []
    wanted = f"Ryzen AI {release}'s runtime" + (f" (onnxruntime-genai {needs['onnxruntime_genai']}, {needs['confidence']})" if needs and needs["onnxruntime_genai"] else "")
    here = env["release"]
    if here is None:
        have = env["onnxruntime_genai"]["version"] if env["onnxruntime_genai"] else "none"
        return [Problem("DR102", "warning", f"the package needs {wanted}; the installed onnxruntime-genai ({have}) is of no known Ryzen AI release",
                        f"install Ryzen AI {release}; packages of one release do not run on another (`invalid unordered_map<K, T> key`)")]
    if machine.release_entry(release) is not machine.release_entry(here["release"]):
        return [Problem("DR101", "error", f"the package is for Ryzen AI {release} but the installed runtime is Ryzen AI {here['release']}'s",
                        f"install Ryzen AI {release}, or use the package built for {here['release']} (a mismatch fails with `invalid unordered_map<K, T> key`)")]
    return []


WINDOWS_DRIVER = re.compile(r"\d+(?:\.\d+){3}")  # 32.0.203.280, and the newer 32.0.20101.3760 (lemonade #3492)


def device_problems(release: str, npu: dict) -> list[Problem]:
    """The NPU here (its PCI device id and driver version) against what the release catalog says the
    package's release supports: the devices its LLM packages run on and its least NPU driver."""
    entry = machine.release_entry(release) if release != "n/a" else None
    if entry is None or not npu.get("present"):
        return []
    out = []
    devices = machine.releases()["devices"]
    device, llm = npu.get("device"), entry.get("llm_devices") or {}
    if device and llm and device not in llm["ids"]:
        known = devices.get(device)
        what = f"{device} ({known['npu']}, {known['apu']})" if known else f"{device}, a device the release catalog does not list"
        runs_on = ", ".join(f"{d} ({devices[d]['npu']}, {devices[d]['apu']})" if d in devices else d for d in llm["ids"])
        out.append(Problem("DR108", "error" if known else "warning", f"the NPU here is {what}; Ryzen AI {entry['release']}'s LLM packages run on {runs_on} ({llm['source']})",
                           "run the package on a machine with a supported NPU, or use a CPU/iGPU model there"))
    minimum, driver = entry.get("driver_minimum"), npu.get("driver") or ""
    if minimum and WINDOWS_DRIVER.fullmatch(driver) and version_tuple(driver) < version_tuple(minimum["version"]):
        out.append(Problem("DR109", "error" if minimum["confidence"] == "documented" else "warning",
                           f"the NPU driver {driver} is older than {minimum['version']}, Ryzen AI {entry['release']}'s least NPU driver ({minimum['confidence']}: {minimum['source']})",
                           "update the NPU driver to the one AMD's Ryzen AI installation page lists for this release"))
    return out


def _config_problems(ctx, release: str, env: dict) -> list[Problem]:
    genai = ctx.genai if isinstance(ctx.genai, dict) else {}
    session = ((genai.get("model") or {}).get("decoder") or {}).get("session_options") if isinstance(genai.get("model"), dict) else None
    session = session if isinstance(session, dict) else {}
    out = []
    runtime = (env["release"] or {}).get("release") or release
    for key, rule in machine.releases()["deprecated_session_keys"].items():
        if key in session and runtime != "n/a" and version_tuple(runtime) >= version_tuple(rule["since"]):
            out.append(Problem("DR103", "warning", f"genai_config.json: session_options.{key} is deprecated since Ryzen AI {rule['since']} (the runtime warns, and may ignore it)",
                               f"move its options into {rule['instead']}"))
    for pointer, value in _paths(genai):
        if value.startswith("/") or WINDOWS_PATH.search(value):
            out.append(Problem("DR104", "error", f"genai_config.json {pointer} is {value!r}, a path of the machine that built it (absolute or Windows-only)",
                               "name the file relative to the package folder, with forward slashes"))
    library = session.get("custom_ops_library")
    linux_values = {e.get("value") for e in ((_linux_plan(release) or {}).get("package_edits") or [])}
    if isinstance(library, str) and library not in linux_values and not WINDOWS_PATH.search(library) and not library.startswith("/") and not (ctx.pkg.root / library).is_file():
        out.append(Problem("DR106", "error", f"genai_config.json session_options.custom_ops_library names {library!r}, which is not beside the package",
                           "add the custom-op library of the package's Ryzen AI release, or remove the key if that release needs none"))
    return out


def _linux_plan(release: str):

    return linux.deployment(release)


def _paths(doc, pointer: str = ""):
    """(JSON pointer, value) of every string under a key that names a file."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        here = f"{pointer}/{key}"
        if isinstance(value, str) and str(key) in PATH_KEYS:
            yield here, value
        elif isinstance(value, (dict, list)):
            yield from _paths(value, here)


# -- the whole answer ----------------------------------------------------------------------------

def doctor(package: Path | None = None) -> Report:
    opened = open_package(package) if package is not None else None  # no package there: exit 3 before probing
    env, problems = environment(opened[0].pkg.root if opened else None)
    report = Report(env, findings=problems)
    if opened is not None:
        report.package, more = check_package(opened, env)
        report.findings += more
    return report


def as_json(report: Report) -> str:

    return json.dumps(safe_tree(report.to_dict()), indent=2)


def as_text(report: Report) -> str:

    env = report.environment
    genai, ort = env["onnxruntime_genai"], env["onnxruntime"]
    rel = env["release"]
    lines = ["environment:",
             f"  onnxruntime-genai: {genai['version'] + ' (' + genai['distribution'] + ')' if genai else 'not installed'}"
             + (f", Ryzen AI {rel['release']} ({rel['confidence']})" if rel else ", of no known Ryzen AI release" if genai else ""),
             f"  onnxruntime: {ort['version'] if ort else 'not installed'}",
             f"  RyzenAI provider in onnxruntime-genai: { {True: 'known', False: 'not known'}.get(env['ryzenai_provider']['known'], 'could not tell')} ({env['ryzenai_provider']['detail']})",
             f"  RyzenAI provider library: {env['provider_library']['path'] or 'none'}" + (" (loads)" if env["provider_library"]["loads"] else ""),
             f"  NPU: {'yes' if env['npu']['present'] else 'none'} ({env['npu']['detail']})",
             f"  NPU readiness (smoke, bench, eval): {'ready' if env['npu_readiness']['ready'] else 'not ready: ' + env['npu_readiness']['reason']}",
             f"  Ryzen AI SDK: {env['sdk']['version'] or 'version unknown'} at {env['sdk']['path']}" if env["sdk"]["path"] else "  Ryzen AI SDK: RYZEN_AI_INSTALLATION_PATH not set"]
    if report.package:
        pkg, needs = report.package, report.package["needs"]
        lines += [f"package: {pkg['path']}", f"  profile {pkg['profile']} ({pkg['profile_reason']})",
                  f"  needs Ryzen AI {pkg['release']}" + (f": onnxruntime-genai {needs['onnxruntime_genai'] or 'version not recorded'} ({needs['confidence']})" if needs else "")]
    if report.findings:
        lines += ["findings:"] + [f"  {p.line()}" for p in report.findings]
    errors = sum(p.severity == "error" for p in report.findings)
    verdict = "ready: this package should run here" if report.package else "ready: this machine can run NPU packages"
    lines.append(verdict if report.ready else f"will not run here: {errors} error(s)")
    return "\n".join(safe(line, 2000) for line in lines) + "\n"
