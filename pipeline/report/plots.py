"""The report's figures: matplotlib drawn to inline SVG, the same bytes on every render.

matplotlib is imported here only, when a page is rendered: `raipack validate` never needs it.
Every label comes from a package or a JSON file and is untrusted: it is cut to a short line of
printable characters and drawn with mathtext off, so text is glyphs, never markup or a formula.
"""

from __future__ import annotations

import io
import re

RC = {
    "svg.hashsalt": "raipack-report",  # clip-path ids from a fixed salt, not a random one
    "svg.fonttype": "path",  # text as glyph outlines: no font needed in the browser
    "text.parse_math": False,  # a '$' in a stage name stays a '$'
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
_COMMENT = re.compile(r"<!--.*?-->\s*", re.S)
_ID = re.compile(r'\bid="([^"]+)"')


def label(text, limit: int = 40) -> str:
    """A short, printable label from untrusted text."""
    s = "".join(c if c.isprintable() else " " for c in str(text)).strip()
    return s if len(s) <= limit else s[: limit - 1] + "…"


def stage_bars(stages: list[dict], prefix: str = "stages") -> str:
    """Horizontal bars: seconds per stage, in build order."""
    names = [label(s["name"]) for s in stages][::-1]
    secs = [float(s["seconds"]) for s in stages][::-1]
    fig, ax = _figure(6.4, 0.4 + 0.35 * max(1, len(stages)))
    bars = ax.barh(range(len(names)), secs, color="#3b6ea5")
    ax.set_yticks(range(len(names)), names)
    ax.bar_label(bars, labels=[f"{s:.1f} s" for s in secs], padding=3, fontsize=8)
    ax.set_xlabel("seconds")
    ax.set_xlim(0, max(secs + [1.0]) * 1.18)
    return _svg(fig, prefix)


def against_length(series: dict[str, list[dict]], key: str, ylabel: str, prefix: str) -> str:
    """One line per backend: `key` (median, with the min..max spread when known) against prompt tokens."""
    from matplotlib.ticker import NullLocator

    fig, ax = _figure(6.4, 3.2)
    for name, points in sorted(series.items()):
        points = sorted(points, key=lambda p: p["prompt_tokens"])
        xs = [p["prompt_tokens"] for p in points]
        ys = [p[key]["median"] for p in points]
        lo = [max(0.0, p[key]["median"] - p[key].get("min", p[key]["median"])) for p in points]
        hi = [max(0.0, p[key].get("max", p[key]["median"]) - p[key]["median"]) for p in points]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", markersize=4, capsize=3, label=label(name, 24))
    ax.set_xscale("log", base=2)
    lengths = sorted({p["prompt_tokens"] for pts in series.values() for p in pts})
    ax.set_xticks(lengths, [str(n) for n in lengths], rotation=45 if len(lengths) > 6 else 0, fontsize=8)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(frameon=False)
    return _svg(fig, prefix)


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    with _rc():
        fig = Figure(figsize=(width, height), layout="constrained")
        return fig, fig.add_subplot()


def _rc():
    import matplotlib

    return matplotlib.rc_context(RC)


def _svg(fig, prefix: str) -> str:
    """The figure as an <svg> element for an HTML page: no XML prolog, no comments, ids unique to `prefix`."""
    buf = io.StringIO()
    with _rc():
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = _COMMENT.sub("", text)
    ids = set(_ID.findall(text))
    text = _ID.sub(lambda m: f'id="{prefix}-{m.group(1)}"', text)
    return re.sub(r'(url\(#|href="#)([^)"]+)', lambda m: f"{m.group(1)}{prefix}-{m.group(2)}" if m.group(2) in ids else m.group(0), text)
