"""A batch matrix (schemas/matrix.schema.json): models x target profiles x override sets, each combination
one entry with its own recipe (pipeline/builder/recipe.py), checked before anything runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from raipack.builder import recipe as recipes
from raipack.builder import stages
from raipack.builder.config import parse_config
from raipack.builder.inputs import check_model_dir
from raipack.core import schemas
from raipack.core.errors import RaipackError, UsageError
from raipack.data import load_data
from raipack.npu import profile as profiles

HINT = "see `raipack schemas matrix`"


@dataclass
class Entry:
    """One matrix entry: a model for a profile with one override set."""

    id: str
    model: str
    profile: str
    overrides: str | None
    recipe: recipes.Recipe
    source: Path | None = None  # the checked model folder, standing in for the source stage; None: the example


@dataclass
class Matrix:
    path: Path
    entries: list[Entry]
    output: Path
    jobs: int | None = None
    executor: str | None = None
    model_package: dict = field(default_factory=dict)


def limits() -> dict:
    return load_data("data/limits.json", "raipack.batch")


def _count(path: Path, doc: dict, max_entries: int | None) -> None:
    """Entries are models x profiles x override sets: counted from the lists' lengths, before any is expanded."""
    bound = max_entries or limits()["max_entries"]
    lengths = [len(doc.get(k)) if isinstance(doc.get(k), list) else 1 for k in ("models", "profiles", "overrides")]
    total = lengths[0] * lengths[1] * max(lengths[2], 1)
    if total > bound:
        raise UsageError(f"{path}: {lengths[0]} models x {lengths[1]} profiles x {max(lengths[2], 1)} override sets make {total} entries, "
                         f"above the limit of {bound}", "split the matrix, or raise the limit with --max-entries N")


def load(path: Path, max_entries: int | None = None) -> Matrix:
    """Read and check a matrix file; every entry's recipe is checked too (its schema, its stages' options and
    preflights), so a bad matrix builds nothing. More entries than `max_entries` (limits.json's default) are refused
    before any is expanded."""
    path = Path(path)
    doc = recipes.read_toml(path, "matrix")
    _count(path, doc, max_entries)
    problems = schemas.errors("matrix", doc)
    if problems:
        pointer, message = problems[0]
        raise UsageError(f"{path}: {message}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""), HINT)
    base = path.resolve().parent
    _unique(path, [m["name"] for m in doc["models"]], "models", "name")
    sets = doc.get("overrides") or [{}]
    _unique(path, [s.get("name") for s in sets], "overrides", "name")
    for pid in doc["profiles"]:
        _profile(path, pid)
    reading = _Reading(path, base, base / doc.get("output", "zoo"), doc.get("recipe", {}), many=len(sets) > 1)
    entries = [_entry(reading, m, pid, s) for m in doc["models"] for pid in doc["profiles"] for s in sets]
    output = reading.output
    return Matrix(path, entries, output, doc.get("jobs"), doc.get("executor"), doc.get("model_package", {}))



def _unique(path: Path, names: list, table: str, key: str) -> None:
    seen = set()
    for i, name in enumerate(names):
        if name in seen:
            raise UsageError(f"{path}: /{table}/{i}/{key} {name!r} is used twice; expected a unique {key}", HINT)
        seen.add(name)


def _profile(path: Path, pid: str) -> None:
    try:
        profiles.get(pid)
    except RaipackError:
        raise UsageError(f"{path}: /profiles: {pid!r} is not a profile; expected a target profile id", "see `raipack profiles`") from None


@dataclass
class _Reading:
    """The matrix file being read: what every entry's recipe is built from."""

    path: Path
    base: Path  # model paths are relative to the matrix's folder
    output: Path
    common: dict  # the matrix's [recipe] table, under every override
    many: bool  # more than one override set: each writes into output/<its name>
    checked: dict = field(default_factory=dict)  # each model folder is checked once (pipeline/builder/inputs.py), however many entries use it


def _entry(reading: _Reading, model: dict, pid: str, override: dict) -> Entry:
    path, base, output, common, many, checked = reading.path, reading.base, reading.output, reading.common, reading.many, reading.checked
    name = override.get("name")
    entry_id = f"{model['name']}@{pid}" + (f"+{name}" if name else "")
    flat = {"name": model["name"], "profile": pid, "output": str(output / name if many else output),
            "trust_remote_code": model.get("trust_remote_code")}
    if "path" in model:
        flat["model"] = str(base / model["path"])
    for table in stages.order():  # the recipe's own shape: a table per stage, the override's options over the common ones
        flat[table] = {**common.get(table, {}), **override.get(table, {})}
    try:
        recipe = recipes.load(None, flat)
        source = None
        if recipe.model:
            ident = (recipe.model, recipe.trust_remote_code)
            source = checked[ident] = checked.get(ident) or check_model_dir(Path(recipe.model), recipe.trust_remote_code)
        profile = profiles.get(pid)
        for st_name in stages.order():
            st = stages.get(st_name)
            cfg = parse_config(st.config, recipe.stages.get(st_name), f"[{st_name}]")
            if st.preflight is not None:
                st.preflight(cfg, profile)
    except RaipackError as exc:
        raise UsageError(f"{path}: entry {entry_id}: {exc}", exc.hint or HINT) from None
    recipe.path = str(path)
    return Entry(entry_id, model["name"], pid, name, recipe, source)
