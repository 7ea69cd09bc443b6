"""Reading the report's inputs: a build's report.json, `raipack bench` JSON, `raipack eval` JSON.

Each is untrusted: read with a size cap, its shape checked before use, and a bad one is one
sentence naming the file and the field (UsageError, exit 2) before anything is written.
"""

from __future__ import annotations

from pathlib import Path

from raipack.core.errors import UsageError
from raipack.core.jsonread import loads_strict
from raipack.core.package import JsonError, ReadError, read_regular

MAX_BYTES = 64 << 20


def read_json(path: Path, what: str) -> dict:
    path = Path(path)
    try:
        raw = read_regular(path, MAX_BYTES)
        if len(raw) > MAX_BYTES:
            raise UsageError(f"{path} is larger than {MAX_BYTES >> 20} MiB; expected {what}", "give the file raipack wrote")
        doc = loads_strict(raw.decode("utf-8"))
    except JsonError as exc:  # a ReadError too: first
        raise UsageError(f"{path} is not JSON ({exc}); expected {what}", "give the file raipack wrote") from None
    except ReadError as exc:
        raise UsageError(f"{exc}; expected {what}", "give the file raipack wrote") from None
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist; expected {what}", "give the path of the file raipack wrote") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} cannot be read: {getattr(exc, 'strerror', None) or exc}", "check the file and its permissions") from None
    except ValueError as exc:
        raise UsageError(f"{path} is not JSON ({exc}); expected {what}", "give the file raipack wrote") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path} holds a JSON {type(doc).__name__}; expected {what} (an object)", "give the file raipack wrote")
    return doc


def _bad(path: Path, field: str, expected: str, hint: str):
    return UsageError(f"{path}: field {field} is not {expected}", hint)


def build_report(path: Path) -> dict:
    """report.json of a raipack build, its stages checked enough to draw them."""
    hint = "report.json is written by `raipack build`; rebuild the package, or remove the file to report on the package alone"
    doc, stages = _document(path, "a raipack build report", "raipack-build-report", "stages", hint)
    for i, st in enumerate(stages):
        if not isinstance(st, dict) or not isinstance(st.get("name"), str) or not _number(st.get("seconds")):
            raise _bad(path, f"stages[{i}]", "an object with a name and seconds", hint)
        if not isinstance(st.get("report", {}), dict):
            raise _bad(path, f"stages[{i}].report", "an object", hint)
    for key in ("tools", "findings"):
        if not isinstance(doc.get(key, {} if key == "tools" else []), dict if key == "tools" else list):
            raise _bad(path, key, "an object" if key == "tools" else "a list", hint)
    return doc


def bench(path: Path) -> dict:
    """`raipack bench --format json` output: rows of prompt length, TTFT and tokens/s."""
    hint = "write it with `raipack bench PACKAGE --format json -o bench.json`"
    doc, rows = _document(path, "raipack bench JSON", "raipack-bench", "rows", hint)
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("backend"), str) or not _count(row.get("prompt_tokens")):
            raise _bad(path, f"rows[{i}]", "an object with a backend and prompt_tokens", hint)
        for key in ("ttft_ms", "tokens_per_s"):
            stats = row.get(key)
            if not isinstance(stats, dict) or not all(_number(v) for v in stats.values()) or not _number(stats.get("median")):
                raise _bad(path, f"rows[{i}].{key}", "an object of numbers with a median", hint)
        _fields(path, row, f"rows[{i}]", {"ran_on": str, "gen_tokens": int, "runs": int, "peak_rss_mb": (int, float, type(None))}, hint)
    machine = doc.get("machine")
    if machine is not None:
        if not isinstance(machine, dict):
            raise _bad(path, "machine", "an object", hint)
        _fields(path, machine, "machine", {"cores": (int, type(None)), "cpu": str}, hint)
    return doc


def _fields(path: Path, obj: dict, where: str, types: dict, hint: str) -> None:
    """Every field the page shows present with its type (the template's StrictUndefined raised on a missing one)."""
    for key, tp in types.items():
        if key not in obj or isinstance(obj[key], bool) or not isinstance(obj[key], tp):
            names = "/".join(t.__name__ for t in (tp if isinstance(tp, tuple) else (tp,)))
            raise _bad(path, f"{where}.{key}", f"present as {names}", hint)


def evaluation(path: Path) -> dict:
    """`raipack eval --output` JSON: lm-eval's results, or raipack's chain of them."""
    doc = read_json(path, "raipack eval JSON (lm-eval's results format)")
    hint = "write it with `raipack eval TARGET --tasks ... --output eval.json`"
    meta = doc.get("raipack") if isinstance(doc.get("raipack"), dict) else {}
    if meta.get("chain") is not None:
        _links(path, meta["chain"], "chain", "stage", hint)
        return doc
    _results(path, doc.get("results"), "results", hint)
    if meta.get("rows") is not None:  # raipack eval --numerics bfp16: the package under each numerics
        _links(path, meta["rows"], "rows", "numerics", hint)
    return doc


def _links(path: Path, links, name: str, key: str, hint: str) -> None:
    """raipack.<name>: a list of objects, each with a string `key` and lm-eval results."""
    if not isinstance(links, list):
        raise _bad(path, f"raipack.{name}", "a list", hint)
    for i, link in enumerate(links):
        if not isinstance(link, dict) or not isinstance(link.get(key), str):
            raise _bad(path, f"raipack.{name}[{i}]", f"an object with a {key}", hint)
        _results(path, link.get("results"), f"raipack.{name}[{i}].results", hint)


def _document(path: Path, what: str, fmt: str, key: str, hint: str) -> tuple[dict, list]:
    """A JSON object of format `fmt` and its list `key`."""
    doc = read_json(path, what)
    if doc.get("format") != fmt:
        raise _bad(path, "format", f'"{fmt}"', hint)
    if not isinstance(doc.get(key), list):
        raise _bad(path, key, "a list", hint)
    return doc, doc[key]


def _results(path: Path, results, field: str, hint: str) -> None:
    if not isinstance(results, dict) or not all(isinstance(v, dict) for v in results.values()):
        raise _bad(path, field, "an object of tasks, each an object of metrics", hint)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0
