"""No import circles among raipack's own modules (issue 40).

The graph is read from the source with `ast`, not from a running interpreter, so an import inside a
function counts like one at the top: a circle held together by a late import is still a circle. The
folders map to import names as pyproject.toml's [tool.setuptools.package-dir] says: pipeline/ is
`raipack`, stages/ is `raipack.stages`. `from raipack.a import b` is an arrow to the package `raipack.a` (its
__init__ runs and `b` is read from it: a package that re-exports a module importing the package is a
circle) and also to `raipack.a.b` when that is a module; `import raipack.a.b` is an arrow to
`raipack.a.b` only (the parents an import runs first are not arrows of their own, as in import-linter's
graph: a package's __init__ may import its submodules, and they each other).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"raipack": REPO / "pipeline", "raipack.stages": REPO / "stages"}

# Circles still allowed, each the set of modules of one strongly connected component.
ALLOWED: list[set[str]] = []


def module_files(roots: dict[str, Path] = ROOTS) -> dict[str, Path]:
    """Import name -> file, for every .py file under the roots (a package is its __init__.py)."""
    out = {}
    for prefix, root in roots.items():
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([prefix, *parts])
            if name in out:  # pipeline/stages/ would shadow stages/
                raise AssertionError(f"{path} and {out[name]} are both {name}")
            out[name] = path
    return out


def _targets(node: ast.AST, here: str, is_package: bool, modules: set[str]) -> list[str]:
    """The project's modules one import statement names."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
        return [n for n in names if n in modules] + [_nearest(n, modules) for n in names if n not in modules and _nearest(n, modules)]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = here.split(".") if is_package else here.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    package_or_module = _nearest(base, modules)
    return [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules] + ([package_or_module] if package_or_module else [])


def _nearest(name: str, modules: set[str]) -> str | None:
    """`name`, or the closest package above it, if it is one of the project's modules."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project's modules it imports anywhere in its code (top level or inside functions)."""
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text("utf-8"), str(path))
        is_package = path.name == "__init__.py"
        graph[name] = {t for node in ast.walk(tree) for t in _targets(node, name, is_package, modules) if t != name}
    return graph


def components(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.add(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(comp)
    return found


def a_cycle(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """One circle through the component's first module, as a path that ends where it starts."""
    start = min(comp)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph[node] & comp):
            if child == start:
                return paths[node] + [start]
            if child not in paths:
                paths[child] = paths[node] + [child]
                queue.append(child)
    raise AssertionError(f"{sorted(comp)} is not a circle")


def circles(graph: dict[str, set[str]], allowed=()) -> list[str]:
    """One line per circle not allowed: its modules in import order."""
    return [" -> ".join(a_cycle(graph, comp)) for comp in components(graph) if comp not in list(allowed)]


def test_no_import_circles():
    graph = import_graph(module_files())
    assert len(graph) > 150 and "raipack.builder.runner" in graph and "raipack.stages.fuse.graph" in graph
    found = circles(graph, ALLOWED)
    assert not found, "import circles (move the shared name one floor down):\n" + "\n".join(found)


def test_the_allowed_circles_still_exist():
    """An allow-list entry whose circle is gone must go too, or it would hide the next one there."""
    present = components(import_graph(module_files()))
    assert all(comp in present for comp in ALLOWED), [sorted(c) for c in ALLOWED if c not in present]


def test_a_circle_put_back_fails(tmp_path):
    """Both kinds: at the top of a module, and behind an import inside a function."""
    pkg = tmp_path / "pipeline" / "builder"
    pkg.mkdir(parents=True)
    (tmp_path / "pipeline" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "naming.py").write_text("def package_name():\n    return 'x'\n")
    (pkg / "logs.py").write_text("from raipack.builder.naming import package_name\n")
    (pkg / "runner.py").write_text("from raipack.builder import logs\nfrom raipack.builder.naming import package_name\n")
    roots = {"raipack": tmp_path / "pipeline"}
    assert circles(import_graph(module_files(roots))) == []
    (pkg / "logs.py").write_text("def _stages_dir():\n    from raipack.builder.runner import package_name\n    return package_name()\n")
    assert circles(import_graph(module_files(roots))) == ["raipack.builder.logs -> raipack.builder.runner -> raipack.builder.logs"]
    (pkg / "logs.py").write_text("from . import runner\n")
    assert circles(import_graph(module_files(roots))) == ["raipack.builder.logs -> raipack.builder.runner -> raipack.builder.logs"]
    assert circles(import_graph(module_files(roots)), [{"raipack.builder.logs", "raipack.builder.runner"}]) == []


def test_a_package_that_re_exports_the_module_importing_it_is_a_circle(tmp_path):
    graph_pkg = tmp_path / "stages" / "fuse" / "graph"
    graph_pkg.mkdir(parents=True)
    (graph_pkg / "__init__.py").write_text("from raipack.stages.fuse.graph.rewrite import fold\nNODE = 1\n")
    (graph_pkg / "rewrite.py").write_text("from raipack.stages.fuse.graph import NODE\n\ndef fold():\n    return NODE\n")
    found = circles(import_graph(module_files({"raipack.stages": tmp_path / "stages"})))
    assert found == ["raipack.stages.fuse.graph -> raipack.stages.fuse.graph.rewrite -> raipack.stages.fuse.graph"]


# Every module of pipeline/ and stages/ (issue 40): an import of raipack's own inside a function says why, in a
# comment starting `# late` on its line, on the comment line just above it, or on the first import of the run of
# imports it belongs to (start-up time, a heavy package the imported module loads, or a stub tests set).
def _says_late(lines: list[str], stmt: ast.stmt) -> bool:
    return "# late" in lines[stmt.lineno - 1] or (stmt.lineno > 1 and lines[stmt.lineno - 2].strip().startswith("# late"))


def unexplained_late_imports(files: dict[str, Path], names) -> list[str]:
    """`path:line` of each import of the project's own modules inside a function with no `# late` comment on its
    line, on the line above it, or on the first import of the run of imports it belongs to."""
    modules, out = set(files), []
    for name in names:
        path = files[name]
        lines = path.read_text("utf-8").splitlines()
        tree = ast.parse("\n".join(lines), str(path))
        where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for body in (getattr(n, field) for n in ast.walk(fn) for field in ("body", "orelse", "finalbody")
                         if isinstance(getattr(n, field, None), list)):
                group: list[ast.stmt] = []
                for stmt in body + [ast.Pass()]:
                    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                        group.append(stmt)
                        continue
                    group_says = bool(group) and _says_late(lines, group[0])
                    out += [f"{where}:{s.lineno} ({name})" for s in group
                            if not (group_says or _says_late(lines, s)) and _targets(s, name, path.name == "__init__.py", modules)]
                    group = []
    return sorted(set(out))


def test_imports_inside_functions_say_why():
    """A new import of a raipack module inside a function, without a `# late` comment, fails here with its file and line."""
    files = module_files()
    assert len(files) > 150
    assert unexplained_late_imports(files, list(files)) == []


def test_an_unexplained_late_import_is_found(tmp_path):
    pkg = tmp_path / "pipeline" / "builder"
    pkg.mkdir(parents=True)
    for name in ("__init__", "naming"):
        (pkg / f"{name}.py").write_text("")
    (pkg / "logs.py").write_text("import os\n\n\ndef f():\n    import json\n\n    from raipack.builder import naming\n    return naming\n\n\n"
                                 "def g():\n    if True:\n        import json  # late: a reason\n        from raipack.builder import naming\n\n\n"
                                 "def h():\n    # a comment that gives no reason\n    from raipack.builder import naming\n    return naming\n\n\n"
                                 "def k():\n    # late: a reason above\n    from raipack.builder import naming\n    return naming\n")
    files = module_files({"raipack": tmp_path / "pipeline"})
    where = tmp_path / "pipeline" / "builder" / "logs.py"
    assert unexplained_late_imports(files, ["raipack.builder.logs"]) == [f"{where}:19 (raipack.builder.logs)", f"{where}:7 (raipack.builder.logs)"]
