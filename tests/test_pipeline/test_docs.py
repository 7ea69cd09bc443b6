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


# ------------------------------------------------------------------ statements the code holds (issue 40)

def test_validate_synopsis_names_every_option():
    """docs/validating.md's synopsis against click's options of `raipack validate` (it lacked --for,
    --platform and --sarif-root)."""
    from raipack.cli.validate import validate

    options = {opt for param in validate.params for opt in getattr(param, "opts", ()) if opt.startswith("--")}
    synopsis = re.search(r"```\n(raipack validate .*?)```", _read("docs/validating.md"), flags=re.S).group(1)
    named = set(re.findall(r"\[(--[a-z][a-z-]*)", synopsis))
    assert named == options, f"in the synopsis, not an option: {sorted(named - options)}; an option missing: {sorted(options - named)}"


def _modules_by_range() -> str:
    """`advice.py` RP0xx; `files.py`, `opened.py`, `runtime.py` RP1xx; ... from the registry."""
    from collections import defaultdict

    from raipack.checks import load_all

    by_range = defaultdict(set)
    for spec in load_all().values():
        by_range[f"RP{spec.id[2]}xx"].add(spec.fn.__module__.rsplit(".", 1)[1])
    return "; ".join(", ".join(f"`{m}.py`" for m in sorted(mods)) + f" {r}" for r, mods in sorted(by_range.items()))


def test_every_check_module_is_listed_with_its_id_range():
    """docs/architecture.md's check recipe lists each range's modules as the registry has them (checks/runtime.py's
    RP111 and RP112 were missing), and no page says a range is one module."""
    expected = _modules_by_range()
    assert "`runtime.py`" in expected and f"({expected})" in _read("docs/architecture.md"), expected
    for page in ("docs/architecture.md", "docs/validating.md"):
        assert not re.search(r"one range per module|one module per id range|the module of its id range", _read(page)), page


def test_the_check_recipe_names_every_file_a_new_check_needs():
    """Without an entry in check_evidence.json, `raipack checks` and docgen raise KeyError."""
    row = next(line for line in _read("docs/architecture.md").splitlines() if line.startswith("| a **check** |"))
    for needed in ("pipeline/data/check_evidence.json", "python -m raipack.docgen", "tests/shared_fixtures.py: make_pkg", "MODULES"):
        assert needed in row, needed
    assert "make_pkg" in _defined(ROOT / "tests" / "shared_fixtures.py")


def test_the_family_recipe_points_to_the_family_table():
    row = next(line for line in _read("docs/architecture.md").splitlines() if line.startswith("| a **model family** |"))
    assert "the family table of `docs/families.md`" in row and "README's family table" not in row
    assert re.search(r"^\| `\w+ForCausalLM` \|", _read("docs/families.md"), flags=re.M)


def test_the_page_action_yml_points_to_describes_the_action():
    """action.yml sends its readers to docs/ci.md, which must speak of the Action and lead to docs/shipping.md,
    where each of its inputs is documented."""
    import yaml

    action_text = _read("action.yml")
    page = re.search(r"Documentation and a workflow example: (docs/\w+\.md)", action_text).group(1)
    ci = _read(page)
    assert "`action.yml`" in ci and "](shipping.md#ci-the-github-action-and-the-pre-commit-hook)" in ci
    inputs = yaml.safe_load(action_text)["inputs"]
    shipping = _read("docs/shipping.md")
    assert [name for name in inputs if f"| `{name}` |" not in shipping] == [], "inputs of action.yml that docs/shipping.md does not document"


def _limit_exemptions() -> list[tuple[str, str]]:
    """(file, the text after the code) of every `# noqa: PLR...` (a function over ruff's size limits)."""
    out = []
    for top in ("pipeline", "stages", "bench", "tests"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for line in path.read_text("utf-8").splitlines():
                if m := re.search(r"#\s*noqa:\s*PLR\d+\s*(.*)$", line):
                    out.append((path.relative_to(ROOT).as_posix(), m.group(1)))
    return out


def test_every_function_over_the_limits_is_named_in_architecture():
    """docs/architecture.md said every function was within the limits while bench/fuse_speed.py carried a noqa."""
    exempt = _limit_exemptions()
    assert ("bench/fuse_speed.py", "- the graph written out node by node, as the builder lays it") in exempt
    page = _read("docs/architecture.md")
    assert [f for f, _ in exempt if f"`{f}`" not in page] == []
    assert [f for f, why in exempt if len(why.strip(" -:()")) < 10] == [], "a noqa of a limit says why on its line"


def _defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text("utf-8"))
    names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_a_name_given_with_its_file_is_defined_there():
    """`tests/factory.py: make_pkg` in a page: make_pkg must be defined in tests/factory.py (it was in
    tests/shared_fixtures.py)."""
    wrong, seen = [], 0
    for page in sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]:
        for rel, names in re.findall(r"`([\w./-]+\.py): ?(\w+(?:`/`\w+)*)`", page.read_text("utf-8")):
            if not (ROOT / rel).is_file():
                continue  # test_every_repository_path_named_exists says so
            defined = _defined(ROOT / rel)
            for name in names.split("`/`"):
                seen += 1
                if name not in defined:
                    wrong.append(f"{page.relative_to(ROOT)}: {rel}: {name}")
    assert seen > 10 and wrong == []
