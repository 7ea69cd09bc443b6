"""Write the genai_config grammar of one onnxruntime-genai version from that version's own source.

onnxruntime-genai parses genai_config.json with a tree of `JSON::Element` classes in `src/config.cpp`:
each class's `OnValue` / `OnObject` / `OnArray` compares the key with string literals and either stores
the value (`JSON::Get<T>` fixes its JSON type), returns the child element, or throws
`JSON::unknown_value_error`. This script reads those classes and writes what each one accepts
(pipeline/data/oga/config-<version>.json), so raipack judges a package's genai_config as the release's
loader does instead of by a hand-kept list. Run it against a clone of microsoft/onnxruntime-genai:

    python -m raipack.npu.loader_grammar_gen --repo PATH v0.9.2 v0.11.2 v0.14.0 HEAD

It imports nothing from raipack and nothing outside the standard library; tests/test_pipeline/
test_loader_differential.py holds its output against each version's real wheel.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "data" / "oga"
STRUCT = re.compile(r"^struct (\w+) : JSON::Element \{", re.M)
METHOD = re.compile(r"(?:void|(?:JSON::)?Element&)\s+(OnValue|OnObject|OnArray)\s*\(([^)]*)\)\s*(?:override)?\s*\{")
KEY = re.compile(r'\bname == "([^"]*)"')
GET = re.compile(r"JSON::Get<(std::string_view|double|bool|std::nullptr_t)>")
GET_TYPES = {"std::string_view": "string", "double": "number", "bool": "bool", "std::nullptr_t": "null"}
MEMBER = re.compile(r"^\s*(?:std::unique_ptr<(\w+)>|std::vector<(\w+)>|(\w+))\s+(\w+_)\s*(?:\{[^;]*\})?;", re.M)
RETURN = re.compile(r"return\s+\*?(\w+)(?:\.back\(\))?\s*;")
THROW_UNKNOWN = "throw JSON::unknown_value_error"


def matching(text: str, start: int) -> int:
    """The index just past the brace that closes the one at `start`, skipping string and char literals."""
    depth, i, n = 0, start, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            i += 1
            while i < n and text[i] != c:
                i += 2 if text[i] == "\\" else 1
        elif c == "/" and text.startswith("//", i):
            i = text.find("\n", i)
            if i < 0:
                return n
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("unbalanced braces")


def structs(source: str) -> dict[str, str]:
    out = {}
    for m in STRUCT.finditer(source):
        brace = source.index("{", m.start())
        out[m.group(1)] = source[brace:matching(source, brace)]
    return out


def branches(body: str) -> tuple[list[tuple[list[str], str]], str]:
    """The method body's top-level `if (name == "k") ... else if ...` chain: [(keys, branch text)],
    and the text that runs for any other name (the final else, and what follows the chain)."""
    out: list[tuple[list[str], str]] = []
    rest: list[str] = []
    i, n = 1, len(body) - 1  # inside the method's braces
    while i < n:
        m = re.compile(r"\s*(else\s+)?if\s*\(").match(body, i)
        if m:
            close = _paren_end(body, m.end() - 1)
            cond = body[m.end():close - 1]
            keys = KEY.findall(cond)
            j = close
            while j < n and body[j].isspace():
                j += 1
            if body[j] == "{":
                end = matching(body, j)
                stmt = body[j:end]
            else:
                end = body.index(";", j) + 1
                stmt = body[j:end]
            if keys:
                out.append((keys, stmt))
            else:
                rest.append(body[i:end])
            i = end
            continue
        m = re.compile(r"\s*else\s*\{").match(body, i)
        if m:
            end = matching(body, m.end() - 1)
            rest.append(body[m.end() - 1:end])
            i = end
            continue
        m = re.compile(r"\s*for\s*\(").match(body, i)
        if m:  # a loop over earlier entries (provider options): what it returns, any name reaches too
            close = _paren_end(body, m.end() - 1)
            j = body.index("{", close)
            end = matching(body, j)
            rest.append(body[j:end])
            i = end
            continue
        end = body.find(";", i)
        if end < 0 or end >= n:
            rest.append(body[i:n])
            break
        rest.append(body[i:end + 1])
        i = end + 1
    return out, "".join(rest)


def _paren_end(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    raise ValueError("unbalanced parentheses")


def value_rule(stmt: str) -> dict:
    """What a value branch accepts: its JSON types and how numbers are read."""
    types = sorted({GET_TYPES[t] for t in GET.findall(stmt)}) or ["any"]
    rule: dict = {"types": types}
    if "number" in types:
        if "SafeDoubleToInt64" in stmt:
            rule["number"] = "int64-checked"
        elif "SafeDoubleToInt(" in stmt:
            rule["number"] = "int32-checked"
        elif re.search(r"static_cast<(?:int|int32_t|uint32_t|size_t|int64_t)>\s*\(\s*JSON::Get<double>", stmt):
            rule["number"] = "int-cast"
    limit = re.search(r"if\s*\([^)]*(<=|<)\s*0\s*\)\s*(?:\{\s*)?throw", stmt)
    if limit:
        rule["minimum"] = 1 if limit.group(1) == "<=" else 0
    enum = re.search(r"(?<![:\w])([A-Z]\w+)\(JSON::Get<std::string_view>\(value\)\)", stmt)
    if enum:
        rule["parser"] = enum.group(1)
    return rule


def members(struct_body: str) -> dict[str, str]:
    out = {}
    for m in MEMBER.finditer(struct_body):
        kind = m.group(1) or m.group(2) or m.group(3)
        if kind.endswith("_Element"):
            out[m.group(4)] = kind
    return out


def child_of(stmt: str, owned: dict[str, str]) -> str | None:
    m = RETURN.search(stmt)
    return owned.get(m.group(1)) if m else None


def wrapped(body: str, source: str) -> dict[str, str]:
    """A wrapper holding `JSON::Element& t_` (RootObject_Element) hands every object to the element
    ParseConfig constructs it with (`RootObject_Element root_object{root}` where `Root_Element root`)."""
    if not re.search(r"JSON::Element& t_;", body):
        return {}
    m = re.search(r"(\w+) root\{config\};", source)
    return {"t_": m.group(1)} if m else {}


def element(name: str, body: str, source: str) -> dict:
    owned = members(body) | wrapped(body, source)
    out: dict = {}
    for m in METHOD.finditer(body):
        kind = m.group(1)
        brace = m.end() - 1
        chain, rest = branches(body[brace:matching(body, brace)])
        if kind == "OnValue":
            out["values"] = {k: value_rule(stmt) for keys, stmt in chain for k in keys}
            if THROW_UNKNOWN not in rest:  # an empty body, or code for any name, takes every other key
                out["any_value"] = value_rule(rest)
        else:
            slot = "objects" if kind == "OnObject" else "arrays"
            out[slot] = {}
            for keys, stmt in chain:
                child = child_of(stmt, owned)
                if child is None:
                    raise ValueError(f"{name}.{kind}: cannot tell what {keys} returns")
                for k in keys:
                    out[slot][k] = child
            if THROW_UNKNOWN not in rest:
                child = child_of(rest, owned)
                if child is None:
                    raise ValueError(f"{name}.{kind}: cannot tell what any other name returns")
                out["any_" + slot[:-1]] = child
    return out


def enums(source: str, names: set[str]) -> dict[str, list[str]]:
    """The strings a parser function (GetGraphOptimizationLevel ...) accepts, when it throws on others."""
    out = {}
    for fn in sorted(names):
        m = re.search(rf"^\w[\w:<> ]*\s{fn}\(std::string_view (\w+)\)\s*\{{", source, re.M)
        if not m:
            continue
        body = source[m.end() - 1:matching(source, m.end() - 1)]
        if "throw" not in body or "tolower" in body:  # a case-folding parser is not a plain list
            continue
        out[fn] = re.findall(rf'\b{m.group(1)} == "([^"]*)"', body)
    return out


def after_parse(source: str) -> list[dict]:
    """Refusals Config's constructor makes once the file is read."""
    rules = []
    if re.search(r"context_length (?:is 0|must be > 0)", source):
        rule = {"pointer": "/model/context_length", "refuse_unless": "> 0", "message": "model context_length is 0 or was not set. It must be greater than 0"}
        if "IsRNNT(model.type)" in source:
            rule["unless_model_type_is"] = "RNNT"
        rules.append(rule)
    return rules


def uncommented(source: str) -> str:
    """The source without // and /* */ comments (their braces and quotes would mislead the reader);
    string literals are kept as they are."""
    out, i, n = [], 0, len(source)
    while i < n:
        c = source[i]
        if c in "\"'":
            j = i + 1
            while j < n and source[j] != c:
                j += 2 if source[j] == "\\" else 1
            out.append(source[i:j + 1])
            i = j + 1
        elif source.startswith("//", i):
            i = source.find("\n", i)
            i = n if i < 0 else i
        elif source.startswith("/*", i):
            i = source.find("*/", i) + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def grammar(source: str, version: str, commit: str) -> dict:
    source = uncommented(source)
    found = structs(source)
    elements = {name: element(name, body, source) for name, body in found.items()}
    parsers = {r["parser"] for e in elements.values() for rules in (e.get("values", {}), {"*": e.get("any_value", {})}) for r in rules.values() if r and "parser" in r}
    return {
        "$comment": "generated by raipack.npu.loader_grammar_gen from onnxruntime-genai's src/config.cpp; do not edit",
        "onnxruntime_genai": version,
        "source": f"microsoft/onnxruntime-genai {commit} src/config.cpp",
        "root": "RootObject_Element",
        "json": {"int_fraction_refused": "is not an integer" in source},
        "elements": dict(sorted(elements.items())),
        "enums": enums(source, parsers),
        "after_parse": after_parse(source),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="a git clone of microsoft/onnxruntime-genai")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("refs", nargs="+", help="tags (v0.14.0) or HEAD")
    args = ap.parse_args(argv)
    for ref in args.refs:
        git = ["git", "-C", args.repo, "-c", "core.hooksPath=/dev/null"]
        commit = subprocess.run([*git, "rev-parse", ref], capture_output=True, text=True, check=True).stdout.strip()
        source = subprocess.run([*git, "show", f"{commit}:src/config.cpp"], capture_output=True, text=True, check=True).stdout
        version = ref.lstrip("v")
        if ref == "HEAD":
            info = subprocess.run([*git, "show", f"{commit}:VERSION_INFO"], capture_output=True, text=True, check=True).stdout.strip()
            version = info
        data = grammar(source, version, commit)
        path = Path(args.out) / f"config-{version}.json"
        path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
        print(f"{path}: {len(data['elements'])} elements from {ref} ({commit[:10]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
