"""A task's Jinja templates rendered in jinja2's immutable sandbox, each render bounded.

lm-eval renders doc_to_text, doc_to_choice, ... with a plain jinja2 Environment (`lm_eval.utils.env`),
where a template can reach Python objects and run code; jinja2's sandbox closes that, but bounds only
each `range` (100 000 items), not their nesting: `range(100000)` inside `range(100000)` never ends.
Here every render has a budget: loop items of `range`, calls and the length of a `*` product count as
operations, and the clock is read at each; past `render_ops` operations or `render_seconds` the render
stops with RenderBudget (a SecurityError), which `raipack eval` turns into one sentence, exit 2.
"""

from __future__ import annotations

import contextlib
import contextvars
import operator
import time

from jinja2 import BaseLoader, StrictUndefined, Template
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from raipack.data import load_data

_budget: contextvars.ContextVar[list] = contextvars.ContextVar("render_budget")


class RenderBudget(SecurityError):
    """A template that needs more operations or seconds than a task's template may."""


def _limits() -> tuple[int, float, int]:
    r = load_data("eval_tasks.json")
    return r["render_ops"], r["render_seconds"], r["render_chars"]


def _spend(n: int = 1) -> None:
    state = _budget.get(None)
    if state is None:
        return
    state[0] -= n
    if state[0] < 0 or time.monotonic() > state[1]:
        ops, secs, _ = _limits()
        raise RenderBudget(f"a template needs more than {ops} operations or {secs} s to render")


def _range(*args):
    for item in range(*args):
        _spend()
        yield item


class _BoundedTemplate(Template):
    def render(self, *args, **kwargs):
        ops, secs, _ = _limits()
        token = _budget.set([ops, time.monotonic() + secs])
        try:
            return super().render(*args, **kwargs)
        finally:
            _budget.reset(token)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    template_class = _BoundedTemplate
    intercepted_binops = frozenset(["*", "**"])

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.globals["range"] = _range

    def call(self, __context, __obj, *args, **kwargs):
        _spend()
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context, operator_name, left, right):
        _spend()
        chars = _limits()[2]
        if operator_name == "**":
            if isinstance(left, (int, float)) and isinstance(right, (int, float)) and abs(right) > 64:
                raise RenderBudget(f"a template raises a number to the power {right}")
            return operator.pow(left, right)
        if isinstance(right, int) and hasattr(left, "__len__") and len(left) * right > chars:
            raise RenderBudget(f"a template builds a value longer than {chars} items")
        if isinstance(left, int) and hasattr(right, "__len__") and len(right) * left > chars:
            raise RenderBudget(f"a template builds a value longer than {chars} items")
        return operator.mul(left, right)


def sandbox() -> BoundedSandbox:
    from lm_eval import utils

    env = BoundedSandbox(loader=BaseLoader, undefined=StrictUndefined, keep_trailing_newline=True)
    env.filters["regex_replace"] = utils.regex_replace
    return env


@contextlib.contextmanager
def sandboxed_templates():
    """lm-eval's template environment replaced by the bounded sandbox while the block runs."""
    from lm_eval import utils

    saved, utils.env = utils.env, sandbox()
    try:
        yield
    finally:
        utils.env = saved
