"""Where the RyzenAI options live in each generation of genai_config.json."""

from __future__ import annotations

from raipack.data import load_data


def ryzenai_options(genai) -> tuple[dict, dict]:
    """Merge the RyzenAI runtime options of any genai_config.json form.

    Returns (options, pointers): option name → value, and option name → the
    JSON pointer where it was found. 1.7+ keeps them in
    `provider_options[i].RyzenAI`; 1.3/1.6 in `session_options` and its
    `config_entries`.
    """
    opts: dict[str, object] = {}
    where: dict[str, str] = {}
    session = _get(genai, "model", "decoder", "session_options")
    if not isinstance(session, dict):
        return opts, where
    base = "/model/decoder/session_options"
    for key, value in session.items():
        if key not in ("provider_options", "config_entries", "log_id"):
            opts[key], where[key] = value, f"{base}/{key}"
    entries = session.get("config_entries")
    if isinstance(entries, dict):
        for key, value in entries.items():
            opts[key], where[key] = value, f"{base}/config_entries/{key}"
    providers = session.get("provider_options")
    if isinstance(providers, list):
        for i, block in enumerate(providers):
            if isinstance(block, dict) and isinstance(block.get("RyzenAI"), dict):
                for key, value in block["RyzenAI"].items():
                    opts[key], where[key] = value, f"{base}/provider_options/{i}/RyzenAI/{key}"
    return opts, where


def provider_names(genai) -> list[str]:
    providers = _get(genai, "model", "decoder", "session_options", "provider_options")
    if not isinstance(providers, list):
        return []
    return [name for block in providers if isinstance(block, dict) for name in block]


def table(doc, key: str) -> dict:
    """doc[key] when doc and it are JSON objects, else an empty one (a mistyped value is the schema
    checks' finding, not a crash here)."""
    value = doc.get(key) if isinstance(doc, dict) else None
    return value if isinstance(value, dict) else {}


def _get(doc, *keys):
    for key in keys:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


def known_options() -> dict:
    """What raipack knows of the RyzenAI runtime's options (pipeline/data/ryzenai_options.json)."""

    return load_data("ryzenai_options.json")
