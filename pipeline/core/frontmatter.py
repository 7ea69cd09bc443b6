"""A README's YAML front matter (a Hugging Face model card's metadata), read with its size bounded
before anything is built from it.

YAML aliases let 459 bytes name a billion values ("billion laughs"): parsing builds shared nodes
cheaply, but printing or serialising the result expands every alias. And a front matter nested
50 000 deep overflows Python's recursion in PyYAML's composer. So the front matter is first walked
as YAML parser events (no recursion, no object built, stopped at the first bound passed), counting
the expanded size (one per node plus each scalar's characters, an alias counting as much as the
node it names) and the nesting depth; only a front matter within both bounds is loaded. A front
matter over a bound, or one whose alias names a node that holds it (a loop), is refused with a
sentence naming the file and the bound. The bounds are data: pipeline/data/hub.json "front_matter".

pyyaml is an optional dependency of raipack (the light install has no YAML), so it is imported
where a front matter is read, not when this module is.
"""

from __future__ import annotations

import importlib

from raipack.core.errors import RaipackError
from raipack.data import load_data


class FrontMatterRefused(RaipackError):
    """The front matter passes a bound or refers to itself: nothing was built from it (exit code 1)."""


class FrontMatterInvalid(RaipackError):
    """The front matter is not valid YAML."""


def _yaml():
    """pyyaml, imported when a front matter is read: an optional dependency (see the module's docstring)."""
    return importlib.import_module("yaml")


def limits() -> dict:
    return load_data("hub.json")["front_matter"]


def split(text: str) -> tuple[str | None, str]:
    """(the YAML between the leading `---` lines, the text after them); (None, text) without front matter."""
    if not text.startswith("---\n"):
        return None, text
    end = text.find("\n---\n", 4)
    if end < 0:
        return None, text
    return text[4:end], text[end + 5 :]


def measure(yaml_text: str, where: str = "README.md") -> int:
    """The expanded size of `yaml_text` (nodes plus scalar characters, aliases expanded); refuses
    (FrontMatterRefused) past the bounds, at the first event that passes one."""
    yaml = _yaml()
    bounds = limits()
    max_depth, max_size = bounds["max_depth"], bounds["max_expanded"]
    anchors: dict[str, int] = {}
    stack: list[tuple[str | None, int]] = []  # (anchor, expanded size when the collection opened)
    size = 0
    try:
        for event in yaml.parse(yaml_text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                stack.append((event.anchor, size))
                size += 1
                if len(stack) > max_depth:
                    raise FrontMatterRefused(f"{where}'s YAML front matter is nested more than {max_depth} deep, raipack's bound for model card metadata",
                                             f"flatten the front matter of {where} (a model card's metadata is a few levels deep)")
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                anchor, start = stack.pop()
                if anchor is not None:
                    anchors[anchor] = size - start
            elif isinstance(event, yaml.ScalarEvent):
                size += 1 + len(event.value)
                if event.anchor is not None:
                    anchors[event.anchor] = 1 + len(event.value)
            elif isinstance(event, yaml.AliasEvent):
                if any(anchor == event.anchor for anchor, _ in stack):
                    raise FrontMatterRefused(f"{where}'s YAML front matter refers to itself (alias *{event.anchor} inside the node it names), which has no finite expansion",
                                             f"replace the alias *{event.anchor} in {where} by the values it stands for")
                size += anchors.get(event.anchor, 1)  # an undefined alias: the loader refuses it below
            if size > max_size:
                raise FrontMatterRefused(f"{where}'s YAML front matter expands (aliases followed) to more than {max_size} characters and nodes, raipack's bound for model card metadata",
                                         f"remove the YAML aliases (*name) that repeat large values in {where}'s front matter")
    except yaml.YAMLError as exc:
        raise FrontMatterInvalid(f"{where}'s front matter is not valid YAML ({str(exc).splitlines()[0]})", f"fix the YAML between the --- lines of {where}") from None
    return size


def load(yaml_text: str, where: str = "README.md"):
    """The front matter as Python values, after `measure` holds it within the bounds."""
    yaml = _yaml()
    measure(yaml_text, where)
    try:
        return yaml.safe_load(yaml_text)
    except yaml.YAMLError as exc:
        raise FrontMatterInvalid(f"{where}'s front matter is not valid YAML ({str(exc).splitlines()[0]})", f"fix the YAML between the --- lines of {where}") from None
    except RecursionError:  # not reached within max_depth; kept so a deep document is never a traceback
        raise FrontMatterRefused(f"{where}'s YAML front matter is nested too deep to read", f"flatten the front matter of {where}") from None
