"""Hooks into AMD Quark's loops: Quark iterates its decoder layers (AWQ, GPTQ) and its export's linears
through the `tqdm` its modules bind; the stage wraps that name to report each finished layer and to give the
heap's free pages back (runtime.trim_heap) between items. The module's own `tqdm` comes back afterwards."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

from raipack.stages.quantize.runtime import trim_heap

Progress = Callable[[str, int, int], None]

# Quark's per-decoder-layer loops iterate `tqdm(range(n_layers), desc=...)` through the name
# `tqdm` bound in these modules; the wrapper below reports each finished layer.
LAYER_LOOPS = {
    "quark.torch.algorithm.awq.awq": "awq",
    "quark.torch.algorithm.common": "gptq",
}
# Quark's export converts each QuantLinear to its packed form in a loop of this module, with this description.
CONVERT_MODULE = "quark.torch.export.main_export.model_post_process"
CONVERT_DESC = "Converting QuantLinear"


@contextmanager
def after_each(module_name: str, after: Callable[[int, int], None], desc_prefix: str = "") -> Iterator[None]:
    """While the block runs: the `tqdm` a Quark module binds calls `after(i, total)` after the i-th item of each
    loop it wraps whose description starts with `desc_prefix` (every loop when empty); the module's own `tqdm`
    comes back afterwards."""
    import importlib

    module = importlib.import_module(module_name)
    original = module.tqdm

    def wrapper(iterable: Any = None, *args: Any, **kwargs: Any) -> Any:
        bar = original(iterable, *args, **kwargs)
        if not str(kwargs.get("desc", "")).startswith(desc_prefix):
            return bar
        total = kwargs.get("total") or (len(iterable) if hasattr(iterable, "__len__") else 0)

        def gen() -> Iterator[Any]:
            for i, item in enumerate(bar, start=1):
                yield item
                after(i, total)

        return gen()

    module.tqdm = wrapper
    try:
        yield
    finally:
        module.tqdm = original


@contextmanager
def report_layers(progress: Progress | None) -> Iterator[None]:
    """While Quark's AWQ/GPTQ loop runs: after each decoder layer, give the heap's free pages back
    (runtime.trim_heap) and report the layer to ``progress``."""

    def after_layer(stage: str) -> Callable[[int, int], None]:
        def after(i: int, total: int) -> None:
            trim_heap()
            if progress is not None:
                progress(stage, i, total)

        return after

    with ExitStack() as stack:
        for module_name, stage in LAYER_LOOPS.items():
            stack.enter_context(after_each(module_name, after_layer(stage)))
        yield


def trim_while_converting() -> AbstractContextManager[None]:
    """While Quark's export converts each QuantLinear to its packed form, give the heap's free pages back after
    each one (runtime.trim_heap): the weights it releases are chunks in the middle of the heap, which glibc keeps
    resident, so anonymous memory grew by the linears' size during the export (four Llama-3.1-8B-width layers,
    AWQ: export peak 7.72 -> 4.25 GiB)."""
    return after_each(CONVERT_MODULE, lambda i, total: trim_heap(), CONVERT_DESC)
