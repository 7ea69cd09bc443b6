"""Generated docs stay in step with the code and data they describe."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from raipack import docgen

ROOT = Path(__file__).resolve().parents[2]


def test_checks_and_profiles_docs_are_current():
    """Every generated page (checks, profiles, the CLI reference, schemas, the site's home) is what
    `python -m raipack.docgen` writes now."""
    assert set(docgen.PAGES) >= {"checks.md", "profiles.md", "cli.md", "schemas.md", "index.md"}
    stale = [name for name, page in docgen.PAGES.items() if (ROOT / "docs" / name).read_text(encoding="utf-8") != page()]
    assert stale == [], f"generated pages out of date: {', '.join(stale)}; run: python -m raipack.docgen"


def test_generated_pages_depend_on_the_repository_only(tmp_path):
    """The lead reruns the generator after a merge: another terminal width, home, cache or working
    folder gives the same bytes."""
    env = {**os.environ, "COLUMNS": "37", "HOME": str(tmp_path), "RAIPACK_CACHE": str(tmp_path / "cache"), "LANG": "C"}
    code = "import json; from raipack import docgen; print(json.dumps({n: p() for n, p in docgen.PAGES.items()}))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {n: p() for n, p in docgen.PAGES.items()}


def test_cli_reference_names_every_command_and_option():
    from raipack.cli import cli

    page = docgen.PAGES["cli.md"]()
    for name, cmd in cli.commands.items():
        assert f"## raipack {name}\n" in page, name
        for param in cmd.params:
            assert all(f"`{opt}`" in page for opt in getattr(param, "opts", [])[:1] if opt.startswith("-")), (name, param.name)
    assert "Sentinel" not in page and "object at 0x" not in page  # no repr of click's internals


# ------------------------------------------------------------------ the site

def _mkdocs(tmp_path, root: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(root / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)


def test_docs_site_builds_strictly(tmp_path):
    run = _mkdocs(tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "site" / "cli" / "index.html").is_file() and (tmp_path / "site" / "index.html").is_file()


def test_docs_site_fails_on_a_broken_link_or_a_page_left_out_of_nav(tmp_path):
    for name, fault in (("orphan", lambda docs: (docs / "orphan.md").write_text("# Not in nav\n")),
                        ("link", lambda docs: (docs / "run.md").write_text((docs / "run.md").read_text() + "\n[gone](no-such-page.md)\n"))):
        copy = tmp_path / name
        shutil.copytree(ROOT / "docs", copy / "docs")
        shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
        fault(copy / "docs")
        run = _mkdocs(copy, copy)
        assert run.returncode != 0, f"{name}: mkdocs --strict passed"
        assert ("orphan.md" if name == "orphan" else "no-such-page.md") in run.stderr, run.stderr[-2000:]


# ------------------------------------------------------------------ statements the docs make about the code

def _read(rel: str) -> str:
    return (ROOT / rel).read_text(encoding="utf-8")


def test_readme_is_a_one_page_introduction():
    from raipack.cli import cli

    readme = _read("README.md")
    assert len(readme.splitlines()) <= 200
    assert "make demo" in readme and "make test" in readme
    assert "not loadable\nby AMD's runtime" in readme or "not loadable by AMD's runtime" in readme
    table = {m for m in re.findall(r"^\| `raipack ([a-z-]+)`", readme, flags=re.M)}
    assert table == set(cli.commands), f"README's command table differs from `raipack --help`: {sorted(table ^ set(cli.commands))}"


def test_architecture_names_every_cli_module():
    row = next(line for line in _read("docs/architecture.md").splitlines() if line.startswith("| `pipeline/cli/`"))
    modules = sorted(p.name for p in (ROOT / "pipeline" / "cli").glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert [m for m in modules if m == "main.py" and "`main.py`" not in row or m != "main.py" and f"`{m}`" not in row] == []


def test_every_top_level_engine_folder_is_in_the_architecture_table():
    page = _read("docs/architecture.md")
    folders = sorted(p.name for p in (ROOT / "pipeline").iterdir() if (p / "__init__.py").is_file())
    assert [f for f in folders if f"pipeline/{f}/" not in page] == []


def test_check_ranges_are_all_documented():
    from raipack.checks import load_all

    ranges = sorted({f"RP{spec.id[2]}xx" for spec in load_all().values()})
    for page in ("docs/validating.md", "docs/architecture.md"):
        assert [r for r in ranges if r not in _read(page)] == [], page


def test_family_table_covers_every_supported_architecture():
    supported = {f["architecture"] for f in json.loads(_read("pipeline/data/architectures.json"))["families"].values()}
    rows = set(re.findall(r"^\| `(\w+ForCausalLM)` \|", _read("docs/families.md"), flags=re.M))
    assert rows == set(supported)


def test_release_profiles_come_from_the_catalog_only():
    """docs/architecture.md: a Ryzen AI release is one catalog entry; no profile file of its own holds a release."""
    raw = {p.stem: json.loads(p.read_text()) for p in (ROOT / "pipeline" / "profiles").glob("*.json")}
    assert raw and sorted(pid for pid, doc in raw.items() if doc.get("release") != "n/a") == []
    assert "one entry in `pipeline/data/ryzenai_releases.json`" in _read("docs/architecture.md")


def test_pre_commit_snippets_pin_a_revision_that_exists():
    """`rev: vX` needs that tag; without a tag the snippets say to pin a commit sha."""
    tags = subprocess.run(["git", "-C", str(ROOT), "tag", "--list"], capture_output=True, text=True).stdout.split() if (ROOT / ".git").exists() else []
    texts = {rel: _read(rel) for rel in (".pre-commit-hooks.yaml", "docs/ci.md")}
    for rel, text in texts.items():
        for rev in re.findall(r"^\s*#?\s*rev:\s*(\S+)", text, flags=re.M):
            assert rev.startswith("<") or re.fullmatch(r"[0-9a-f]{40}", rev) or rev in tags, f"{rel}: rev {rev} is no tag of this repository"


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
