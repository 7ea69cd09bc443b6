"""`raipack lemonade register`, tested against user_models.json as lemonade's own code reads it.

`lemonade_reads` below is a port of how lemonade-sdk/lemonade (commit e385039ed33551de7f54cb73194cd08088772c08)
loads the file: `ModelManager::build_cache` ("Load user models with user. prefix") with
`JsonUtils::get_or_default` (nlohmann `get<T>`, which throws on a value of the wrong type and so stops
lemonade building its model list), `parse_model_source_fields`, `illegal_deployment_labels` and
`ensure_deployment_label` (src/cpp/server/backends/backend_descriptor_registry.cpp), and what the
ryzenai-llm backend needs to load an entry: `resolve_model_path` (a `local_path` checkpoint is used
as is) and `RyzenAIServer::load` (the path must exist; RyzenAiOps: a folder holding genai_config.json).
"""

from __future__ import annotations

import json
import os
import stat

import pytest

from helpers import run_cli
from raipack import lemonade

RYZENAI_MODES = {"ryzenai-llm": ["chat"]}  # ryzenai.h supported_modes
MODE_LABELS = {"chat": "llm", "embeddings": "embedding", "embedding": "embedding", "reranking": "reranking", "transcription": "transcription",
               "image": "image", "tts": "tts", "audio-generation": "audio", "classification": "cls", "classifier": "cls", "3d": "mesh"}  # model_types.h


class LemonadeRejects(Exception):
    pass


def _get(value: dict, key: str, kind, default):
    if key in value and value[key] is not None:
        v = value[key]
        if kind is float and isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        if not isinstance(v, kind) or (kind is not bool and isinstance(v, bool)):
            raise LemonadeRejects(f"{key}: nlohmann type_error, {type(v).__name__} is not {kind.__name__}")
        return v
    return default


def lemonade_reads(doc) -> dict:
    """user.NAME -> what lemonade keeps of each entry it can load (a port; see the module docstring)."""
    if not isinstance(doc, dict):
        raise LemonadeRejects("user_models.json is not an object")
    models = {}
    for key, value in doc.items():
        info = {"checkpoint": _get(value, "checkpoint", str, ""), "recipe": _get(value, "recipe", str, ""),
                "suggested": _get(value, "suggested", bool, True), "source": _get(value, "source", str, ""), "size": _get(value, "size", float, 0.0)}
        labels = []
        if isinstance(value.get("labels"), list):
            for label in value["labels"]:
                if not isinstance(label, str):
                    raise LemonadeRejects("label.get<std::string>() on a non-string")
                labels.append(label)
        modes = RYZENAI_MODES.get(info["recipe"], [])
        claimed = [MODE_LABELS[x] for x in labels if x in MODE_LABELS]
        if any(c not in {MODE_LABELS[m] for m in modes} for c in claimed) or len(set(claimed)) > 1:
            continue  # "Skipping ... illegal labels"
        if not claimed:
            labels.append(modes[0] if modes else "chat")
        info["labels"] = labels
        info["resolved"] = info["checkpoint"] if info["source"] == "local_path" else None
        models["user." + key] = info
    return models


def ryzenai_can_load(info: dict) -> bool:
    path = info["resolved"]
    return info["recipe"] in RYZENAI_MODES and bool(info["checkpoint"]) and path is not None and os.path.isdir(path) and os.path.isfile(os.path.join(path, "genai_config.json"))


@pytest.fixture
def amd_pkg(make_pkg):
    return make_pkg("1.8.0-npu-16K")


def test_register_writes_an_entry_lemonade_loads(amd_pkg, tmp_path, capsys):
    conf = tmp_path / "conf"
    code, out, err = run_cli(capsys, "lemonade", "register", amd_pkg, "--config-dir", conf, "--labels", "reasoning,tool-calling")
    assert code == 0, err
    doc = json.loads((conf / "user_models.json").read_text())
    models = lemonade_reads(doc)
    info = models[f"user.{amd_pkg.name}"]
    assert ryzenai_can_load(info)
    assert info["recipe"] == "ryzenai-llm" and info["suggested"] is True and info["size"] > 0
    assert set(info["labels"]) == {"custom", "reasoning", "tool-calling", "chat"}
    assert json.loads(out) == doc and f"user.{amd_pkg.name} written to" in err
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((conf / "user_models.json").stat().st_mode) == 0o666 & ~umask  # a plain new file, not mkstemp's 0600


def test_an_update_keeps_other_entries_and_replaces_by_rename(amd_pkg, tmp_path, capsys):
    conf = tmp_path / "conf"
    conf.mkdir()
    registry = conf / "user_models.json"
    other = {"Phi-4-Mini-GGUF": {"checkpoint": "unsloth/Phi-4-mini-instruct-GGUF:Q4_K_M", "recipe": "llamacpp", "labels": ["custom"], "suggested": True}}
    registry.write_text(json.dumps({**other, "mine": {"checkpoint": "old", "recipe": "ryzenai-llm"}}))
    os.chmod(registry, 0o640)
    before = registry.stat()
    code, _, err = run_cli(capsys, "lemonade", "register", amd_pkg, "--config-dir", conf, "--name", "user.mine")
    assert code == 0, err
    assert "user.mine replaced in" in err
    doc = json.loads(registry.read_text())
    assert doc["Phi-4-Mini-GGUF"] == other["Phi-4-Mini-GGUF"] and doc["mine"]["checkpoint"] == str(amd_pkg.resolve())
    after = registry.stat()
    assert after.st_ino != before.st_ino and stat.S_IMODE(after.st_mode) == 0o640  # renamed over, mode kept
    assert sorted(p.name for p in conf.iterdir()) == ["user_models.json", "user_models.json.lock"]  # no temporary file left (the lock file stays)


def test_a_failed_write_leaves_the_registry_as_it_was(amd_pkg, tmp_path, capsys, monkeypatch):
    conf = tmp_path / "conf"
    conf.mkdir()
    registry = conf / "user_models.json"
    registry.write_text('{"a": {"checkpoint": "x", "recipe": "llamacpp"}}')

    def fail(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail)
    code, _, err = run_cli(capsys, "lemonade", "register", amd_pkg, "--config-dir", conf)
    assert code == 1 and "No space left on device" in err
    assert registry.read_text() == '{"a": {"checkpoint": "x", "recipe": "llamacpp"}}'
    assert sorted(p.name for p in conf.iterdir()) == ["user_models.json", "user_models.json.lock"]  # no temporary file left (the lock file stays)


def test_a_reference_package_is_refused_unless_allowed(make_pkg, tmp_path, capsys):
    ref = make_pkg("reference-16K")
    conf = tmp_path / "conf"
    code, _, err = run_cli(capsys, "lemonade", "register", ref, "--config-dir", conf)
    assert code == 1 and "reference package" in err and "cannot load" in err and "--allow-reference" in err
    assert not (conf / "user_models.json").exists()
    code, _, err = run_cli(capsys, "lemonade", "register", ref, "--config-dir", conf, "--allow-reference")
    assert code == 0, err
    assert ryzenai_can_load(lemonade_reads(json.loads((conf / "user_models.json").read_text()))[f"user.{ref.name}"])


def test_dry_run_prints_and_writes_nothing(amd_pkg, tmp_path, capsys):
    conf = tmp_path / "conf"
    code, out, err = run_cli(capsys, "lemonade", "register", amd_pkg, "--config-dir", conf, "--dry-run", "--name", "npu-test")
    assert code == 0 and json.loads(out)["npu-test"]["recipe"] == "ryzenai-llm" and "dry run" in err
    assert not conf.exists()


@pytest.mark.parametrize("content", ["not json", "[1, 2]"])
def test_a_registry_raipack_cannot_read_is_never_overwritten(amd_pkg, tmp_path, capsys, content):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "user_models.json").write_text(content)
    code, _, err = run_cli(capsys, "lemonade", "register", amd_pkg, "--config-dir", conf)
    assert code == 1 and "does not overwrite it" in err
    assert (conf / "user_models.json").read_text() == content


def test_labels_and_names_lemonade_would_refuse(amd_pkg, tmp_path, capsys):
    conf = tmp_path / "conf"
    code, _, err = run_cli(capsys, "lemonade", "register", amd_pkg, "--config-dir", conf, "--labels", "embeddings")
    assert code == 2 and "cannot serve" in err
    # the port agrees: lemonade skips such an entry
    assert lemonade_reads({"x": {"checkpoint": str(amd_pkg), "recipe": "ryzenai-llm", "labels": ["embeddings"], "source": "local_path"}}) == {}
    for bad in ("extra.thing", "user.builtin.x", "user."):
        code, _, err = run_cli(capsys, "lemonade", "register", amd_pkg, "--config-dir", conf, "--name", bad)
        assert code == 2, bad
    assert not conf.exists()


def test_config_folder_per_platform_as_lemonade_finds_it():
    assert lemonade.config_dir({"HOME": "/h"}, "linux").as_posix() == "/h/.config/lemonade"
    assert lemonade.config_dir({"HOME": "/h", "XDG_CONFIG_HOME": "/x"}, "linux").as_posix() == "/x/lemonade"
    assert lemonade.config_dir({"HOME": "/h", "STATE_DIRECTORY": "/var/lib/lemonade"}, "linux").as_posix() == "/var/lib/lemonade"
    assert lemonade.config_dir({"HOME": "/Users/u", "STATE_DIRECTORY": "/s"}, "darwin").as_posix() == "/Users/u/.config/lemonade"
    assert str(lemonade.config_dir({"USERPROFILE": "C:\\Users\\u"}, "win32")).replace("\\", "/").endswith("C:/Users/u/.config/lemonade")
    with pytest.raises(lemonade.UsageError, match="HOME is not set") as info:
        lemonade.config_dir({}, "linux")
    assert "--config-dir" in info.value.hint
