"""A task folder's YAML read as plain data: no tags at all, a bounded depth, aliases within a budget.

PyYAML's loaders build what a tag names (lm-eval's own adds `!function`, which imports Python) and expand
aliases without a bound (a 1 KB file can stand for gigabytes). Here the event stream is read first, without
recursion: any explicit tag, a nesting deeper than MAX_DEPTH or more than MAX_ALIASES aliases is refused
before anything is built; the node tree is then turned into dicts, lists and scalars with every node
counted, aliases included, against MAX_NODES.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from raipack.core.errors import UsageError

MAX_DEPTH = 40  # lm-eval's own task files nest at most 5 deep
MAX_ALIASES = 100
MAX_NODES = 100_000  # values after alias expansion: the largest task file of lm-eval's registry has a few hundred
MAX_BYTES = 4 << 20
PLAIN = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "seq", "map")}
HINT = "write the task file as plain YAML data: no tags (!function, !!python), no deep nesting, few anchors"


def _where(path: Path, mark) -> str:
    return f"{path}, line {mark.line + 1}" if mark is not None else str(path)


def _scan(path: Path, text: str) -> None:
    """Tags, depth and alias count from the parser's events (the parser is a state machine: no recursion)."""
    depth = aliases = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        tag = getattr(event, "tag", None)
        if tag is not None and not isinstance(event, yaml.DocumentStartEvent):
            raise UsageError(f"{_where(path, event.start_mark)}: the tag {tag} is not allowed in a task file", HINT)
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise UsageError(f"{_where(path, event.start_mark)} nests deeper than {MAX_DEPTH} levels", HINT)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise UsageError(f"{_where(path, event.start_mark)}: more than {MAX_ALIASES} aliases (*name) in one file", HINT)


class _Builder:
    """Nodes to Python values, each counted (an alias counts its whole subtree again)."""

    def __init__(self, path: Path):
        self.path, self.count = path, 0
        self.scalars = yaml.SafeLoader("")

    def build(self, node, depth: int = 0):
        self.count += 1
        if self.count > MAX_NODES:
            raise UsageError(f"{self.path} expands to more than {MAX_NODES} values (aliases repeating aliases)", HINT)
        if node.tag == "tag:yaml.org,2002:timestamp":  # a date stays the text it was written as
            return node.value
        if node.tag not in PLAIN:
            raise UsageError(f"{_where(self.path, node.start_mark)}: the tag {node.tag} is not allowed in a task file", HINT)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(n, depth + 1) for n in node.value]
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, depth)
        return self.scalars.construct_object(node)

    def _mapping(self, node, depth: int) -> dict:
        out: dict = {}
        merged: dict = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`, YAML's merge key
                value = self.build(value_node, depth + 1)
                for one in value if isinstance(value, list) else [value]:
                    if not isinstance(one, dict):
                        raise UsageError(f"{_where(self.path, value_node.start_mark)}: a merge key (<<) names something that is not a mapping", HINT)
                    merged.update({k: v for k, v in one.items() if k not in merged})
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise UsageError(f"{_where(self.path, key_node.start_mark)}: a mapping key is not a plain value", HINT)
            key = self.build(key_node, depth + 1)
            if key in out:
                raise UsageError(f"{_where(self.path, key_node.start_mark)}: the key {key!r} appears twice", HINT)
            out[key] = self.build(value_node, depth + 1)
        return {**merged, **out}


def load(path: Path) -> object:
    """The one YAML document of `path` as plain data; any other content is one UsageError sentence."""
    path = Path(path)
    try:
        raw = path.read_bytes()[: MAX_BYTES + 1]
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not a readable UTF-8 text file ({exc.__class__.__name__})", HINT) from None
    if len(raw) > MAX_BYTES:
        raise UsageError(f"{path} is larger than {MAX_BYTES >> 20} MB; a task file is a few KB", HINT)
    try:
        _scan(path, text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise UsageError(f"{path} is not valid YAML ({str(exc).splitlines()[0]})", HINT) from None
    return None if node is None else _Builder(path).build(node)
