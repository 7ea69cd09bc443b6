"""`raipack validate --lemonade`: every Ryzen AI model lemonade knows, judged where it lies, in one table.

lemonade's models are its built-in registry (`server_models.json`, found beside its executable or under its
install prefixes) and the user's `user_models.json` (its config folder); the ones of the `ryzenai-llm`
recipe are Ryzen AI packages. Each is validated from lemonade's model folder when it is there (the Hugging
Face cache unless lemonade's `models_dir` says otherwise: a snapshot, pipeline/places/hfcache.py), from its
local folder for a user model registered by path, and from the Hub by name otherwise (`hf://`,
pipeline/places/hub.py: nothing large downloaded). Every fact about lemonade, with the source lines it
comes from: pipeline/data/lemonade_registry.json.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from raipack.core.errors import RaipackError, UsageError
from raipack.core.findings import Result
from raipack.core.jsonread import loads_strict
from raipack.core.package import ReadError, read_regular
from raipack.data import load_data
from raipack.lemonade import config_dir, facts
from raipack.places import HUB_SCHEME, hfcache
from raipack.validate import validate_all

MAX_BYTES = 64 * 1024 * 1024


@dataclass
class Model:
    name: str  # as lemonade lists it (a user model with lemonade's `user.` prefix)
    checkpoint: str  # org/name on the Hub, or a local folder
    source: str  # the registry file it comes from
    target: str = ""  # what raipack validates: a cache snapshot folder, hf://org/name or the local folder
    where: str = ""  # cache, hub or local


def rules() -> dict:
    return load_data("lemonade_registry.json")


def builtin_file(env=None, platform: str | None = None) -> Path | None:
    """lemonade's server_models.json where its install puts it (None when no install prefix holds one)."""
    env = os.environ if env is None else env
    platform = platform or sys.platform
    data = rules()
    key = "win32" if platform.startswith("win") else "darwin" if platform == "darwin" else "linux"
    for var, sub in data["install_prefixes"][key]:
        if var and not env.get(var):
            continue
        candidate = (Path(env[var]) / sub if var else Path(sub)) / data["builtin_file"]
        if candidate.is_file():
            return candidate
    return None


def models(server_models: Path | None, config: Path | None) -> list[Model]:
    """The ryzenai-llm models of the built-in registry and of the user's user_models.json, in that order."""
    recipes = set(rules()["recipes"])
    out: list[Model] = []
    builtin = server_models or builtin_file()
    if builtin is None:
        raise UsageError("lemonade's built-in model registry (resources/server_models.json) is not under any of its install folders here",
                         "give the file with --lemonade-models (it is in lemonade's install folder, beside lemonade-server)")
    user = (Path(config) if config else _config_dir()) / facts()["file"]
    for file, prefix in ((Path(builtin), ""), (user, facts()["name_prefix"])):
        for name, entry in _registry(file).items():
            if isinstance(entry, dict) and entry.get("recipe") in recipes and isinstance(entry.get("checkpoint"), str):
                out.append(Model(prefix + name, entry["checkpoint"], str(file), where=entry.get("source", "")))
    return out


def _registry(file: Path) -> dict:
    """A lemonade JSON file as an object (read whole, at most MAX_BYTES; a key twice is refused, as lemonade's reader would differ)."""
    if not file.exists() and file.name != "server_models.json":
        return {}  # a user who registered nothing has no user_models.json, nor config.json
    try:
        raw = read_regular(file, MAX_BYTES)
        if len(raw) > MAX_BYTES:
            raise RaipackError(f"{file} is larger than {MAX_BYTES} bytes; it is not a lemonade registry", "give lemonade's own file")
        doc = loads_strict(raw.decode("utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{file} does not exist; expected lemonade's model registry", "give the path of lemonade's server_models.json") from None
    except (OSError, ReadError) as exc:
        raise RaipackError(f"{file} cannot be read: {getattr(exc, 'strerror', None) or exc}", "check the file and its permissions") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise RaipackError(f"{file} is not lemonade's JSON ({exc})", "check the file") from None
    if not isinstance(doc, dict):
        raise RaipackError(f"{file} holds a JSON {type(doc).__name__}, expected an object of models", "check the file")
    return doc


def _config_dir() -> Path | None:
    try:
        return config_dir()
    except UsageError:
        raise UsageError("lemonade's config folder is unknown here (no HOME or XDG_CONFIG_HOME), so its user_models.json cannot be found",
                         "give the folder with --lemonade-config") from None


def models_dir(config: Path | None) -> Path:
    """Where lemonade keeps its models: config.json's models_dir, or the Hugging Face cache when it is auto."""
    data = rules()
    file = (Path(config) if config else _config_dir()) / data["config_file"]
    value = _registry(file).get(data["models_dir_key"]) if file.is_file() else None
    if not value or value == data["models_dir_auto"]:
        return hfcache.default_root()
    if not isinstance(value, str) or not Path(value).is_absolute():
        raise UsageError(f"{file} sets models_dir to {value!r}, which lemonade reads relative to its own executable",
                         "validate that folder as a PATH instead (raipack validate FOLDER)")
    return Path(value)


def locate(found: list[Model], cache: Path) -> list[Model]:
    """Each model's target: its cached snapshot (refs/main), its local folder, else the Hub by name."""
    local = rules()["local_source"]
    for model in found:
        checkpoint = model.checkpoint.split(":", 1)[0] if model.where != local else model.checkpoint
        if model.where == local:
            model.target, model.where = checkpoint, "local"
            continue
        repo_dir = cache / ("models--" + checkpoint.replace("/", "--"))
        try:
            model.target, model.where = str(hfcache.snapshot_of(repo_dir)), "cache"
        except (UsageError, OSError):
            model.target, model.where = HUB_SCHEME + checkpoint, "hub"
    return found


def validate_models(found: list[Model], jobs: int = 1, **selection) -> list[tuple[Model, Result | RaipackError]]:
    """Every model's outcome, in registry order (`selection`: Selection's fields)."""
    outcomes = validate_all([m.target for m in found], jobs=jobs, **selection) if found else []
    if len(outcomes) != len(found):  # a local folder that is a zoo: one at a time, each its first package
        outcomes = [validate_all([m.target], **selection)[0] for m in found]
    return list(zip(found, outcomes))


def table(rows: list[tuple[Model, Result | RaipackError]]) -> str:
    """One line per model: name, where it was read, profile, verdict."""
    lines = [("model", "read from", "profile", "verdict")]
    for model, outcome in rows:
        if isinstance(outcome, RaipackError):
            lines.append((model.name, model.where, "-", f"not judged: {outcome}"))
            continue
        counts = ", ".join(f"{outcome.count(s)} {s}" for s in ("error", "warning") if outcome.count(s))
        skipped = sum(1 for f in outcome.findings if f.severity == "info" and f.message.startswith("skipped: "))
        verdict = ("FAIL" if outcome.failed() else "ok") + (f" ({counts})" if counts else "") + (f", {skipped} checks skipped" if skipped else "")
        lines.append((model.name, model.where, outcome.profile, verdict))
    widths = [max(len(row[i]) for row in lines) for i in range(3)]
    return "\n".join("  ".join(cell.ljust(widths[i]) if i < 3 else cell for i, cell in enumerate(row)).rstrip() for row in lines) + "\n"
