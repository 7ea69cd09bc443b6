"""Recipes: a TOML file (or the same fields as flags) describing one build."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import tomllib

from raipack.builder import stages
from raipack.core import schemas
from raipack.core.errors import UsageError
from raipack.core.findings import Finding
from raipack.core.package import ReadError, read_regular

EXAMPLE_NAME = "SmolLM2-135M-Instruct"


class RecipeError(UsageError):
    """A recipe that does not match its schema; carries the findings."""

    def __init__(self, findings: list[Finding]):
        first = findings[0]
        super().__init__(f"{first.path}: {first.message}" + (f" (and {len(findings) - 1} more)" if len(findings) > 1 else ""), first.hint)
        self.findings = findings


@dataclass
class Recipe:
    model: str | None = None
    name: str | None = None
    profile: str = "1.8.0-npu-16K"
    output: str = "build"
    trust_remote_code: bool = False
    expected_answer: str | None = None
    stages: dict[str, dict] = field(default_factory=dict)
    path: str | None = None
    eval: dict | None = None  # the [eval] table: the accuracy gate (pipeline/builder/config.py: EvalConfig)

    @property
    def is_example(self) -> bool:
        return self.model is None

    def model_name(self) -> str:
        if self.name:
            return self.name
        return EXAMPLE_NAME if self.is_example else Path(self.model).resolve().name


def check(doc: dict, where: str) -> None:
    findings = [Finding("RP202", "error", where, message, "see `raipack schemas recipe`", pointer) for pointer, message in schemas.errors("recipe", doc)]
    if findings:
        raise RecipeError(findings)


def layered(doc: dict, overrides: dict | None) -> dict:
    """`doc` (a recipe's shape) with `overrides` over it: top-level fields, and stage tables merged option by
    option ({"quantize": {"algorithm": "rtn"}}, or "quantize.algorithm": "rtn"); None means not given."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in doc.items()}
    tables = set(stages.order())
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if "." in key:
            key, value = key.split(".", 1)[0], {key.split(".", 1)[1]: value}
        if key in tables and isinstance(value, dict):
            table = out.setdefault(key, {})
            if isinstance(table, dict):  # else the recipe's own non-table value stays, for the schema to name
                table.update({k: v for k, v in value.items() if v is not None})
        else:
            out[key] = value
    return out


def load(path: Path | None, overrides: dict | None = None) -> Recipe:
    """Read a recipe file (optional) and apply flag overrides (see `layered`)."""
    doc: dict = {}
    where = "(flags)"
    if path is not None:
        path = Path(path)
        where = str(path)
        doc = read_toml(path, "recipe")
    doc = {k: v for k, v in layered(doc, overrides).items() if v != {} or k not in stages.order()}  # a flag-less table is no table
    check(doc, where)
    tables = stages.order()
    top = {k: v for k, v in doc.items() if k not in tables}
    recipe = Recipe(**top, stages={t: dict(doc.get(t, {})) for t in tables}, path=str(path) if path else None)
    if recipe.is_example and recipe.expected_answer is None:
        recipe.expected_answer = "Paris"
    return recipe


def read_toml(path: Path, what: str) -> dict:
    """A TOML file a user gives (a recipe, a batch matrix), or one sentence saying why it cannot be read."""
    try:
        return tomllib.loads(_plain_text(path, what))
    except FileNotFoundError:
        raise UsageError(f"{what} {path} does not exist", f"give the path of a .toml {what} file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{what} {path} cannot be read: {exc}", "check the file") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{what} {path} is not valid TOML: {exc}", "fix the syntax") from None
    except RecursionError:
        raise UsageError(f"{what} {path} nests arrays or tables too deeply to read", "write a flat TOML file") from None


MAX_TOML_BYTES = 1 << 20  # a recipe or a matrix is a few KB


def _plain_text(path: Path, what: str) -> str:
    """The file's text, opened without blocking and only when it is a plain file (a FIFO would hang the read)."""

    try:
        raw = read_regular(path, MAX_TOML_BYTES)
    except ReadError:
        raise UsageError(f"{what} {path} is not a plain file (a folder, FIFO or device)", f"give the path of a .toml {what} file") from None
    if len(raw) > MAX_TOML_BYTES:
        raise UsageError(f"{what} {path} is larger than {MAX_TOML_BYTES >> 20} MB", f"a {what} is a few KB: check the file")
    return raw.decode("utf-8")
