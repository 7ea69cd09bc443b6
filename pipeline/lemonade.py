"""`raipack lemonade register`: make a package selectable in lemonade as `user.NAME`.

lemonade keeps the models a user registers in `user_models.json` (its config folder), one entry per
name without the `user.` prefix. raipack writes the entry lemonade's own registration writes for a
local folder (`lemonade pull user.NAME --checkpoint DIR --recipe ryzenai-llm`): `checkpoint` (the
folder holding genai_config.json, with `source: local_path`), `recipe`, `labels` (normalised as
lemonade does: `custom`, the user's labels, then the recipe's deployment label `chat`), `size` in
GB and `suggested: true`. Every fact about lemonade and its source lines: pipeline/data/lemonade.json.

The file is read whole (a file that is not a JSON object is refused, never overwritten), the entry
replaced or added, and the result written to a temporary file beside it and renamed over it, as
lemonade's own `save_user_json` does: a reader never sees half a registry. The read-modify-write holds
an exclusive flock on `user_models.json.lock` beside the registry, so concurrent registrations each
keep their entry. A symbolic link at the registry path is written through (the file it names is
replaced; the link stays). Refused, never overwritten, in one sentence: a registry that is not a
regular file (a FIFO is never opened blocking), holds NaN, Infinity or a number out of a double's
range, a key twice in one object, or nesting deeper than Python's JSON parser takes.
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from raipack.core.errors import RaipackError, UsageError
from raipack.core.output import atomic_write_bytes
from raipack.data import load_data
from raipack.npu.profile import get
from raipack.npu.target import Target
from raipack.validate import validate_all

try:
    import fcntl
except ImportError:  # Windows: no flock (see locked())
    fcntl = None  # type: ignore[assignment]

MAX_BYTES = 64 * 1024 * 1024
LOCK_SUFFIX = ".lock"  # user_models.json.lock, beside the registry
LOCK_SECONDS = 60.0  # how long a registration waits for another to finish


def facts() -> dict:
    return load_data("lemonade.json")


def config_dir(env=None, platform: str | None = None) -> Path:
    """lemonade's config folder on this platform, found as lemonade finds it."""
    env = os.environ if env is None else env
    platform = platform or sys.platform
    rules = facts()["config_dir"]["win32" if platform.startswith("win") else "darwin" if platform == "darwin" else "linux"]
    for var, sub in rules:
        if env.get(var):
            return Path(env[var]) / sub if sub else Path(env[var])
    names = " or ".join(var for var, _ in rules)
    raise UsageError(f"lemonade's config folder is unknown here: {names} is not set", "give it with --config-dir")


@dataclass
class Registration:
    name: str  # without the user. prefix, as the file's key
    entry: dict
    file: Path
    replaced: bool = False


def clean_name(name: str) -> str:
    prefix = facts()["name_prefix"]
    bare = name[len(prefix) :] if name.startswith(prefix) else name
    if not bare or bare != bare.strip() or any(c in bare for c in "/\\\n\t"):
        raise UsageError(f"--name {name!r} is not a lemonade model name", "give a plain name such as Llama-3.2-1B-NPU (lemonade shows it as user.Llama-3.2-1B-NPU)")
    for reserved in facts()["reserved_prefixes"]:
        if bare.startswith(reserved):
            raise UsageError(f"--name {name!r} starts with {reserved!r}, which lemonade reserves for models it did not register", "choose another name")
    return bare


def normalized_labels(labels) -> list[str]:
    """lemonade's normalized_definition_labels for the ryzenai-llm recipe: `custom`, the labels given
    once each, and `chat`; a label naming another deployment mode is refused as lemonade refuses it."""
    data = facts()
    out = ["custom"]
    for label in labels:
        if label not in out:
            out.append(label)
    modes = {data["deployment_labels"][x] for x in data["recipe_modes"]}
    for label in out:
        mode = data["deployment_labels"].get(label)
        if mode is not None and mode not in modes:
            raise UsageError(f"--labels names {label!r}, a mode lemonade's {data['recipe']} recipe cannot serve (it serves {', '.join(data['recipe_modes'])})",
                             "leave the label out: the model deploys as a chat model")
    if not any(label in data["deployment_labels"] for label in out):
        out += [m for m in data["recipe_modes"][:1] if m not in out]
    return sorted(set(out))  # lemonade stores a std::set: sorted, unique


def entry_for(package: Path, labels=()) -> dict:
    data = facts()
    size = sum(p.stat().st_size for p in package.rglob("*") if p.is_file() and not p.is_symlink() and ".git" not in p.relative_to(package).parts)
    return {"checkpoint": str(package.resolve()), "recipe": data["recipe"], "labels": normalized_labels(labels),
            "size": float(f"{size / data['size_unit_bytes']:.3g}"), "suggested": True, "source": data["local_source"]}


def check_package(package: Path, allow_reference: bool) -> None:
    """Refuse what lemonade's runtime could not load: a package that fails validation, a raipack reference package."""
    outcomes = validate_all([package])
    if len(outcomes) != 1:
        raise UsageError(f"{package} is a folder of {len(outcomes)} packages; register takes one package folder", f"register each one: raipack lemonade register {package}/NAME")
    outcome = outcomes[0]
    if isinstance(outcome, RaipackError):
        raise outcome
    errors = [f for f in outcome.findings if f.severity == "error"]
    if errors:
        f = errors[0]
        raise RaipackError(f"{package} fails validation ({f.check_id} {f.path}: {f.message}), so lemonade could not load it", "run `raipack validate` on it and fix the errors first")

    profile = get(outcome.profile)
    if profile.target is Target.REFERENCE and not allow_reference:
        raise RaipackError(f"{package} is a raipack reference package (profile {outcome.profile}): its NPU files are raipack's open formats, which AMD's Ryzen AI runtime behind lemonade's {facts()['recipe']} recipe cannot load",
                           "build it with the fuse stage's ryzenai-sdk backend for an AMD release profile, or pass --allow-reference to register it anyway")
    if not (package / "genai_config.json").is_file():
        raise RaipackError(f"{package} has no genai_config.json, the file lemonade's {facts()['recipe']} recipe looks for", "register the folder that holds genai_config.json")


class _Refused(ValueError):
    """A registry JSON raipack does not rewrite (raised inside json.loads' hooks)."""


def _no_duplicates(pairs: list) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise _Refused(f"it holds the key {key!r} twice in one object (JSON keeps only one of them)")
        seen[key] = value
    return seen


def _no_constant(name: str):
    raise _Refused(f"it holds {name}, which is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"it holds the number {text}, which is out of a double's range")
    return value


def _open_regular(path: Path, flags: int) -> int | None:
    """A descriptor of the regular file at `path` (None when there is none); never blocks on a FIFO
    or a device, which are refused."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RaipackError(f"cannot open {path}: {exc.strerror or exc}", "check the file and its folder's permissions") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RaipackError(f"{path} is not a regular file (a folder, FIFO, socket or device); raipack reads and replaces only a plain JSON file there",
                           "move it away, then register again")
    os.set_blocking(fd, True)
    return fd


def read_registry(path: Path) -> dict:
    """The current user_models.json ({} when absent). Refused, never overwritten: a file that is not
    a regular file, not a JSON object, holds NaN, Infinity or a number out of a double's range, a key
    twice in one object, or nesting deeper than Python's parser takes."""
    fd = _open_regular(path, os.O_RDONLY)
    if fd is None:
        return {}
    try:
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise RaipackError(f"cannot read {path}: {exc.strerror or exc}", "check its permissions") from None
    if len(raw) > MAX_BYTES:
        raise RaipackError(f"{path} is larger than {MAX_BYTES} bytes; it is not a lemonade registry raipack will rewrite", "check the file")
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant, parse_float=_finite)
    except _Refused as exc:
        raise RaipackError(f"{path} is refused: {exc}; raipack does not overwrite it", "fix or move the file, then register again") from None
    except RecursionError:
        raise RaipackError(f"{path} is nested deeper than raipack's JSON reader takes; raipack does not overwrite it", "fix or move the file, then register again") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise RaipackError(f"{path} is not valid JSON ({exc}); raipack does not overwrite it", "fix or move the file, then register again") from None
    if not isinstance(doc, dict):
        raise RaipackError(f"{path} holds a JSON {type(doc).__name__}, expected an object of models; raipack does not overwrite it", "fix or move the file, then register again")
    return doc


def registry_target(file: Path) -> Path:
    """The file read and replaced: `file`, or, when `file` is a symbolic link, the file it names (the
    link is written through and stays a link, as a user who keeps the registry elsewhere wants)."""
    return Path(os.path.realpath(file)) if file.is_symlink() else file


@contextmanager
def locked(target: Path, timeout: float = LOCK_SECONDS):
    """Hold an exclusive lock on `target`'s lock file (beside it, never removed) for one
    read-modify-write: concurrent registrations each see the entries the others wrote. POSIX only
    (fcntl.flock); where there is no fcntl (Windows) the write is atomic but not serialised."""
    lock = target.with_name(target.name + LOCK_SUFFIX)
    if fcntl is None:
        yield
        return
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as exc:
        raise RaipackError(f"cannot open the lock file {lock}: {exc.strerror or exc}", f"check that {lock.parent} is a folder you can write to") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RaipackError(f"{lock} is not a regular file; raipack locks the registry with it", "move it away, then register again")
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RaipackError(f"{lock} stayed locked for {timeout:.0f} s: another registration holds the registry", "wait for it to finish, then register again") from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # releases the lock


def register(package: Path, name: str | None = None, labels=(), *, config: Path | None = None, dry_run: bool = False,
             allow_reference: bool = False) -> Registration:
    """Write (or, dry_run, only compute) the lemonade entry of `package`."""
    package = Path(package)
    check_package(package, allow_reference)
    bare = clean_name(name or package.resolve().name)
    file = (Path(config) if config else config_dir()) / facts()["file"]
    entry = entry_for(package, labels)
    if dry_run:
        return Registration(bare, entry, file, replaced=bare in read_registry(registry_target(file)))
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RaipackError(f"cannot create lemonade's config folder {file.parent}: {exc.strerror or exc}", "give a folder you can write to with --config-dir") from None
    target = registry_target(file)
    with locked(target):
        registry = read_registry(target)
        reg = Registration(bare, entry, file, replaced=bare in registry)
        registry[bare] = entry
        fd = _open_regular(target, os.O_RDONLY)
        like = os.fstat(fd) if fd is not None else None
        if fd is not None:
            os.close(fd)
        atomic_write_bytes(target, (json.dumps(registry, indent=2, allow_nan=False) + "\n").encode("utf-8"), like=like)
    if like is None:  # a new file gets the mode any new file gets here, as lemonade's own would (not the temporary file's 0600)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(target, 0o666 & ~umask)
    return reg
