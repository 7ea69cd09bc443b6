"""Rendering the page: Jinja2 templates shipped with raipack (autoescape on, so a package's strings are
text, never markup) and matplotlib figures as inline SVG. No script, no network, no font to fetch."""

from __future__ import annotations

import hashlib
from pathlib import Path

from raipack.core.errors import UsageError
from raipack.core.output import atomic_write_text
from raipack.core.package import role_of
from raipack.report import inputs
from raipack.report.collect import for_package, page_data
from raipack.summary import summary

TEMPLATES = Path(__file__).resolve().parent / "templates"
PAGE = "report.html.j2"
NAME = "report.html"
NEEDS = "the report needs matplotlib and jinja2: pip install 'raipack[report]'"


def available() -> str | None:
    """None when the page can be rendered, else why not (one sentence)."""
    import importlib.util

    missing = [m for m in ("jinja2", "matplotlib") if importlib.util.find_spec(m) is None]
    return f"{' and '.join(missing)} not installed; {NEEDS}" if missing else None


def render(data: dict) -> str:
    """The page's HTML for page data (pipeline/report/collect.py)."""
    why = available()
    if why:
        raise UsageError(f"cannot render the report: {why}", "install the report extra, or use report.json")
    import jinja2

    # late: plots imports matplotlib, only when a page is rendered
    from raipack.report import plots

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = _num
    figures = {}
    if data["stages"]:
        figures["stages"] = plots.stage_bars(data["stages"], "fig-stages")
    perf = data["perf"]
    if perf.get("source"):
        figures["ttft"] = plots.against_length(perf["series"], "ttft_ms", "time to first token (ms)", "fig-ttft")
        if perf["source"] == "bench":
            figures["tps"] = plots.against_length(perf["series"], "tokens_per_s", "tokens per second", "fig-tps")
    return env.get_template(PAGE).render(d=data, figures=figures)


def write_build_page(folder: Path, report: dict, findings: list, profile: str, warn) -> dict | None:
    """report.html of an assembled package; its manifest entry, or None when it was not written.

    A build never fails for its report: without matplotlib or jinja2, or when rendering fails, `warn`
    gets one line and the package has no report.html (report.json holds the same facts)."""
    why = available()
    if why:
        warn(f"report.html not written: {why}")
        return None
    folder = Path(folder)
    try:

        summ = summary(folder, profile)
        evaluation = inputs.evaluation(folder / "eval.json") if (folder / "eval.json").is_file() else None  # the [eval] gate's chain
        html = render(page_data(Path(report.get("package") or folder).name, summ, [f.to_dict() for f in findings], report, None, evaluation))
        path = folder / NAME
        atomic_write_text(path, html)
    except Exception as exc:  # the report is an extra; the package is what the build owes
        warn(f"report.html not written: {type(exc).__name__}: {exc}")
        return None
    data = path.read_bytes()
    return {"path": NAME, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "role": role_of(NAME)}


def _num(v, digits: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return str(v) if isinstance(v, int) else f"{v:.{digits}f}"


def write_report(package: Path, output: Path | None = None, bench: Path | None = None, evaluation: Path | None = None) -> Path:
    """`raipack report`: the page of any package, written atomically to `output` (default ./report.html).

    The default never lands inside the package: from the package's own folder give -o. Every input is
    read and checked, and the page rendered, before anything is written."""

    why = available()
    if why:  # before reading anything: the light install has neither
        raise UsageError(f"cannot render the report: {why}", "install the report extra, or read report.json")
    package = Path(package)
    explicit = output is not None
    output = Path(output if explicit else NAME)
    if not explicit and package.is_dir() and _inside(output, package):
        raise UsageError(f"the default output {output.resolve()} is inside the package {package}", "give -o: a path outside the package, or inside it on purpose")
    if output.is_dir():
        raise UsageError(f"-o {output} is a folder; expected the path of the HTML file to write", f"for example -o {output / NAME}")
    if not output.resolve().parent.is_dir():
        raise UsageError(f"-o {output}: the folder {output.resolve().parent} does not exist", "create it first, or write somewhere else")
    html = render(for_package(package, bench, evaluation))
    atomic_write_text(output, html)
    return output


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False
