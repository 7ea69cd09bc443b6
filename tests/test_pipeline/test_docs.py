"""Generated docs stay in step with the code and data they describe."""

import ast
import json
import re
from pathlib import Path

from raipack import docgen

ROOT = Path(__file__).resolve().parents[2]


def test_checks_and_profiles_docs_are_current():
    assert (ROOT / "docs" / "checks.md").read_text() == docgen.checks_md(), "run: python -m raipack.docgen"
    assert (ROOT / "docs" / "profiles.md").read_text() == docgen.profiles_md(), "run: python -m raipack.docgen"


def test_validate_accepts_a_genai_config_path(make_pkg):
    from raipack.validate import validate

    pkg = make_pkg("1.8.0-npu-16K")
    assert validate(pkg / "genai_config.json").root == str(pkg)


# ------------------------------------------------------------------ pointers that lead somewhere

TOP = ("pipeline", "stages", "schemas", "tests", "bench", "docs")
GENERATED = ("bench/out/", "build/")  # outputs a run writes, named before they exist
REPO_PATH = re.compile(r"(?<![\w/.~-])((?:%s)/[\w./-]*\w\.(?:py|md|json|toml|txt|jinja))\b" % "|".join(TOP))
MD_NAME = re.compile(r"(?<![\w/.~-])([\w./-]*\w\.md)\b")
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _sources():
    """The repository's own text files: code, data, docs."""
    for top in TOP:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in (".py", ".md", ".json", ".toml") and "__pycache__" not in path.parts and path.is_file():
                yield path
    yield from (ROOT / "README.md", ROOT / "pyproject.toml", ROOT / "Makefile")


def _prose(path: Path) -> list[str]:
    """What a reader follows in a file: docstrings of a module, docs' text, data files' comments."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return [d for node in ast.walk(ast.parse(text)) if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
                for d in [ast.get_docstring(node)] if d]
    if path.suffix == ".json":
        found = []

        def walk(node):
            if isinstance(node, dict):
                found.extend(v for k, v in node.items() if k in ("$comment", "description", "notes", "why") and isinstance(v, str))
                node = list(node.values())
            for item in node if isinstance(node, list) else ():
                walk(item)

        walk(json.loads(text))
        return found
    return [text] if path.suffix == ".md" else []


def test_every_repository_path_named_exists():
    """A path such as pipeline/…/x.py in code, data or docs names a file of this repository."""
    missing = []
    for path in _sources():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            missing += [f"{path.relative_to(ROOT)}:{n}: {p}" for p in REPO_PATH.findall(line)
                        if not p.startswith(GENERATED) and not (ROOT / p).exists()]
    assert missing == [], "files named that do not exist (moved or removed?):\n" + "\n".join(missing)


def test_every_document_named_or_linked_exists():
    """A .md file a docstring, a doc or a data file's comment names, and every relative link of the
    docs, leads to a file of the repository (not to notes outside it)."""
    missing = []
    for path in _sources():
        for text in _prose(path):
            names = MD_NAME.findall(text) + [t for t in MD_LINK.findall(text) if "://" not in t]
            missing += [f"{path.relative_to(ROOT)}: {name}" for name in names
                        if not (ROOT / name).exists() and not (path.parent / name).exists()]
    assert missing == [], "documents named that are not in the repository:\n" + "\n".join(missing)


def test_every_rule_says_what_fails_at_run_time_and_cites_its_evidence():
    """pipeline/data/check_evidence.json: each RP rule's effect, consequence and evidence; an
    error only where the runtime fails, computes wrong results or reads what is not the package;
    a rule without evidence never an error; advice only for tuning."""
    from raipack.checks import load_all
    from raipack.data import load_data

    specs = load_all()
    rules = load_data("check_evidence.json")["rules"]
    assert sorted(rules) == sorted(specs), "rules without evidence, or evidence for no rule"
    allowed = {"error": {"fails", "wrong", "unsafe"}, "warning": {"degrades", "unsafe"}, "advice": {"tuning"}, "info": {"tuning"}}
    for cid, spec in specs.items():
        ev = rules[cid]
        assert len(ev["consequence"]) > 40 and len(ev["evidence"]) > 20, cid
        assert ev["effect"] in allowed[spec.severity], f"{cid}: a {spec.severity} whose effect is {ev['effect']}"
        if ev["evidence"].lower().startswith("no evidence found"):
            assert spec.severity != "error", f"{cid}: an error without evidence"
    checks_md = (ROOT / "docs" / "checks.md").read_text()
    for cid in specs:
        section = checks_md.split(f"## {cid} ", 1)[1].split("\n## ", 1)[0]
        assert "**At run time:**" in section and "**Evidence:**" in section, cid
