"""Typed stage configs: dataclasses filled from recipe tables, unknown keys refused."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, get_args, get_origin

from raipack.core.errors import UsageError


@dataclasses.dataclass
class EvalConfig:
    """A recipe's [eval] table: the accuracy gate run after the stages, before the package is assembled."""

    tasks: list[str] = dataclasses.field(default_factory=list)
    include_path: str | None = None  # relative to the recipe's folder
    limit: int | None = None
    num_fewshot: int | None = None
    max_drop: float = 0.05
    numerics: Literal["float", "bfp16"] | None = None  # bfp16: the package is scored under BFP16 too, and that row is gated; unset: the device's (bfp16 for NPU targets)


def parse_config(cls, data: dict | None, where: str):
    """Build dataclass `cls` from `data`; one clear sentence for the first bad key."""
    data = dict(data or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise UsageError(f"{where}: unknown option {unknown[0]!r}", f"the options of this stage are: {', '.join(fields)}")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, value in data.items():
        values[name] = _coerce(value, hints[name], f"{where}.{name}")
    return cls(**values)


def _coerce(value: Any, tp, where: str):
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        if value not in args:
            raise UsageError(f"{where} is {value!r}; expected one of {', '.join(map(repr, args))}", "fix the recipe or the flag")
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arg in args:
            if arg is type(None) and value is None:
                return None
            try:
                return _coerce(value, arg, where)
            except UsageError as exc:
                errors.append(str(exc).split("; expected ")[-1])
        raise UsageError(f"{where} is {value!r}; expected {' or '.join(errors)}", "fix the recipe or the flag")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise UsageError(f"{where} is {value!r}; expected a list", "write it as [\"a\", \"b\"]")
        return [_coerce(v, args[0] if args else Any, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, bool) or not isinstance(value, tp):
        raise UsageError(f"{where} is {value!r}; expected {_name(tp)}", "fix the recipe or the flag")
    return value


def _name(tp) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a table"}.get(tp, getattr(tp, "__name__", str(tp)))


def config_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)
