"""The quick tier, `make check`: the tests that build nothing, selected by a marker expression.

Markers say what a test costs: `slow` (the example model end to end), `seeds` (a tiny model per
family through every stage), `fuzz` (the mutation harness), and, set here at collection from the
evidence in the code of the test, of every fixture it uses, of the functions of their own modules
those call (transitively, docstrings left out) and in its parameters:

- `builds`: it builds a model or package (a tiny Llama or family model, a Quark export, the
  reference packages of tests/factory.py, a model package), directly or through a fixture;
- `ray`: it starts a Ray cluster; `browser`: it opens a page in chromium.

`make check` runs `-m "not (slow or seeds or fuzz or builds or ray or browser)"` with
RAIPACK_TEST_TIER=check, and in that tier every builder of the tests fails the test that calls it
(`refuse_in_quick_tier`): a test the evidence above misses fails, naming the marker to add, and
never makes the quick tier slow in silence. `make test` runs everything, and holds every test of the
quick tier to the same guard while it runs (`guarded`, from tests/conftest.py), so a test that builds
without its marker fails `make test` too, at no cost in time: the quick tier cannot break unseen
(issue 40: it had, with 9 tests of the fake builds).
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

TIER_ENV = "RAIPACK_TEST_TIER"
NOT_QUICK = ("slow", "seeds", "fuzz", "builds", "ray", "browser")
QUICK = f"not ({' or '.join(NOT_QUICK)})"  # the Makefile's QUICK
EVIDENCE = {  # regular expressions over code (docstrings left out)
    "builds": re.compile(r"reference_package|reference_export|reference_build|model_package\(|make_tiny_model|build_tiny_quark|make_tiny_llama"
                         r"|['\"](reference-(\d|4K|16K)|ort-model-package)"  # a reference or model-package profile's id: its packages are built (tests/factory.py)
                         r"|fake_stages|FAKES|run_fake_build"  # the fake stages write copies of the reference-16K package (tests/helpers.py: fake builds)
                         r"|import_quark\(|from quark|import quark"  # importing Quark may compile its C++ extension (minutes with an empty HOME)
                         r"|convert_gguf_to_hf|AutoModelForCausalLM|ForCausalLM\(|runner import build|write_bf16_safetensors"),  # a model made or converted
    "ray": re.compile(r"['\"]ray['\"]|RayExecutor|ray_executor|import ray"),
    "browser": re.compile(r"open_in_chromium"),
}


def _code(obj) -> ast.AST | None:
    """A function's syntax tree without its docstrings (which name builders they do not call)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return tree


def _source(obj, seen: set | None = None) -> str:
    """The code of `obj` and of every function of its own module it calls, transitively."""
    seen = set() if seen is None else seen
    tree = _code(obj)
    if tree is None or id(obj) in seen:
        return ""
    seen.add(id(obj))
    module = inspect.getmodule(obj)
    texts = [ast.unparse(tree)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            called = getattr(module, node.func.id, None)
            if inspect.isfunction(called) and inspect.getmodule(called) is module:
                texts.append(_source(called, seen))
    return "\n".join(texts)


_SOURCES: dict = {}


def _source_once(obj) -> str:
    """_source(obj), read once per function: 3000 tests share a few hundred fixtures and helpers, and
    reading them again for every test made collection take 35 s (30 s of it here) in every worker."""
    key = obj if callable(obj) else id(obj)
    if key not in _SOURCES:
        _SOURCES[key] = _source(obj)
    return _SOURCES[key]


def evidence(item) -> str:
    """The test function's source, every fixture it uses (they include the fixtures those use), and its parameters."""
    texts = [_source_once(getattr(item, "function", None))]
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    texts += [_source_once(d.func) for name in getattr(item, "fixturenames", ()) for d in defs.get(name, ())]
    texts += [repr(v) for v in getattr(getattr(item, "callspec", None), "params", {}).values()]
    return "\n".join(texts)


def mark(items) -> None:
    for item in items:
        text = evidence(item)
        for marker, words in EVIDENCE.items():
            if marker not in item.keywords and words.search(text):
                item.add_marker(marker)


def refuse_in_quick_tier(what: str) -> None:
    """Called by every builder of the tests: in `make check` a test that builds fails, named."""
    if os.environ.get(TIER_ENV) == "check":
        pytest.fail(f"{what}: this test builds, so it does not belong in `make check`; mark it @pytest.mark.builds (tests/tiers.py)", pytrace=False)


def in_quick_tier(item) -> bool:
    """Whether `make check` selects the test (after `mark`): it has none of the markers QUICK excludes."""
    return not any(item.get_closest_marker(name) for name in NOT_QUICK)


@contextmanager
def guarded(item) -> Iterator[None]:
    """While a test of the quick tier runs in any run, the quick tier's guard is on (RAIPACK_TEST_TIER=check,
    for its fixtures and the processes it starts too), as in `make check`; a run that set the tier itself
    is left as it is."""
    if os.environ.get(TIER_ENV) or not in_quick_tier(item):
        yield
        return
    os.environ[TIER_ENV] = "check"
    try:
        yield
    finally:
        os.environ.pop(TIER_ENV, None)
