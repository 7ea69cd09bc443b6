"""The package's README as a Hugging Face model card: YAML front matter, then the card the fuse
stage wrote, then the numbers of the build.

Front matter (data: pipeline/data/model_card.json): `base_model` only as the source model names
itself (`_name_or_path` of its config.json, or the package's, when it is a hub id `owner/name`,
not a local path; never guessed; else a comment line says why it is missing),
`base_model_relation: quantized`, `license` from the source model's README front matter or a LICENSE
file it ships (else none), `library_name`, `pipeline_tag`, `tags` (ryzenai, npu, the quantization
algorithm and weight type, the Ryzen AI release, the target profile) and a `model-index` with the
accuracy results when the build has any (report.json "eval": lm-eval's results format, or a
chain whose last stage is the package).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from raipack.core import frontmatter
from raipack.data import load_data
from raipack.npu import profile as profiles
from raipack.report.chain import chain_lines

MARK = "\n## Build record\n"
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
REFERENCE_NOTE = "# raipack reference package: its NPU files are raipack's open formats (docs/formats.md), not loadable by AMD's Ryzen AI runtime"


def build_section(report: dict) -> str:
    lines = [MARK, f"Built by raipack for profile `{report['profile']}` in {report['seconds']:.0f} s.", "",
             "| stage | status | seconds | summary |", "|---|---|---|---|"]
    for s in report["stages"]:
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:.1f} | {s['report'].get('summary', '')} |")
    quality = []
    for s in report["stages"]:
        for k, v in (s["report"].get("quality") or {}).items():
            quality.append(f"| {s['name']} | {k} | {v} |")
    if quality:
        lines += ["", "| stage | measure | value |", "|---|---|---|"] + quality
    chain = chain_lines(report["stages"])  # source → Quark → export → package (float) → package (BFP16, predicted)
    if chain:
        lines += ["", load_data("model_card.json")["quality_chain_heading"], ""] + [f"- {line}" for line in chain]
    lines += ["", "Tools: " + ", ".join(f"{k} {v}" for k, v in report["tools"].items()), ""]
    return "\n".join(lines)


def _json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def split_front_matter(text: str, where: str = "README.md") -> tuple[dict, str]:
    """(the YAML front matter of a README as a dict, the text after it); ({}, text) without one or
    when it is not valid YAML. A front matter past raipack's bounds (pipeline/core/frontmatter.py:
    nesting, expanded size) raises FrontMatterRefused, a sentence naming `where`."""
    front, body = frontmatter.split(text)
    if front is None:
        return {}, text
    try:
        doc = frontmatter.load(front, where)
    except frontmatter.FrontMatterInvalid:
        return {}, text
    return (doc if isinstance(doc, dict) else {}), body


def base_model(folders: list[Path]) -> tuple[str | None, str]:
    """(the hub id the source model names itself by, "") or (None, why there is none)."""
    for folder in folders:
        name = _json(folder / "config.json").get("_name_or_path")
        if isinstance(name, str) and HUB_ID.match(name) and not Path(name).exists():
            return name, ""
    return None, "base_model omitted: the source model's config.json names no hub id (_name_or_path), and raipack does not guess one"


def license_of(source: Path | None) -> str | None:
    """The source model's license: its README front matter, else a LICENSE file matched by its text."""
    if source is None or not source.is_dir():
        return None
    data = load_data("model_card.json")
    readme = source / "README.md"
    if readme.is_file():
        value = split_front_matter(readme.read_text("utf-8", errors="replace"), str(readme))[0].get("license")
        if isinstance(value, str) and value.strip():
            return value.strip()
    for name in data["license_files"]:
        if (source / name).is_file():
            text = (source / name).read_text("utf-8", errors="replace")[:20000].lower()
            return next((e["id"] for e in data["licenses"] if all(p in text for p in e["phrases"])), None)
    return None


def tags(report: dict) -> list[str]:

    quant = next((s["report"] for s in report["stages"] if s["name"] == "quantize"), {})
    prof = profiles.get(report["profile"])
    found = [quant.get("algorithm"), str(quant.get("scheme") or "").split("_")[0] or None,
             f"ryzenai-{prof.release}" if prof.release else None, report["profile"]]
    return list(dict.fromkeys([*load_data("model_card.json")["tags"], *(t for t in found if t)]))


def eval_results(report: dict, folder: Path) -> dict:
    """task -> {metric: value} of the package from report.json's "eval" (lm-eval's format, or a chain)."""
    doc = report.get("eval") or _json(folder / "report.json").get("eval") or {}
    results = doc.get("results") if isinstance(doc, dict) else None
    chain = ((doc.get("raipack") or {}).get("chain") if isinstance(doc, dict) else None) or []
    if results is None and chain and isinstance(chain[-1], dict):
        results = chain[-1].get("results")
    out = {}
    for task, metrics in (results or {}).items():
        values = {k.split(",")[0]: v for k, v in (metrics or {}).items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and "_stderr" not in k.split(",")[0]}
        if values:
            out[str(task)] = values
    return out


def model_index(name: str, results: dict) -> list[dict]:
    return [{"name": name, "results": [{"task": {"type": "text-generation", "name": "Text Generation"}, "dataset": {"name": task, "type": task},
                                        "metrics": [{"name": m, "type": m, "value": v} for m, v in metrics.items()]} for task, metrics in results.items()]}]


def front_matter(report: dict, folder: Path, source: Path | None = None) -> str:
    """The YAML block (with its --- lines) for the package in `folder`."""
    import yaml

    data = load_data("model_card.json")
    base, why = base_model([p for p in (source, folder) if p is not None])
    doc: dict = {"base_model": base} if base else {}
    doc["base_model_relation"] = data["base_model_relation"]
    lic = license_of(source)
    if lic:
        doc["license"] = lic
    doc.update(library_name=data["library_name"], pipeline_tag=data["pipeline_tag"], tags=tags(report))
    results = eval_results(report, folder)
    if results:
        doc["model-index"] = model_index(report["model"], results)
    fuse = next((s["report"] for s in report["stages"] if s["name"] == "fuse"), {})
    comments = [f"# {why}"] if why else []
    comments += [REFERENCE_NOTE] if fuse.get("backend", "reference") == "reference" else []
    return "---\n" + "\n".join(comments + [yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).rstrip("\n")]) + "\n---\n"


def append_build_numbers(readme: Path, report: dict, source: Path | None = None) -> None:
    """The card: front matter (replacing one raipack wrote before), the fuse stage's text, the build record."""
    text = readme.read_text("utf-8") if readme.exists() else f"# {report['model']}\n"
    body = split_front_matter(text)[1].lstrip("\n")
    body = body.split(MARK)[0].rstrip("\n") + "\n" + build_section(report)
    readme.write_text(front_matter(report, readme.parent, source) + "\n" + body, "utf-8")
