"""`raipack validate --lemonade` on lemonade's real registry (tests/data/lemonade/server_models.json, with its
provenance): one row per ryzenai-llm model, each read from the Hugging Face cache (filled by huggingface_hub's
own snapshot_download), from its local folder (a user model) or from the Hub stand-in of tests/hub_server.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from factory import make_package
from hub_server import FakeHub, Repo, env_for, served_repo, snapshot_download
from raipack.core.errors import UsageError
from raipack.lemonade_models import builtin_file, locate, models, models_dir
from real_corpus import rebuild

DATA = Path(__file__).resolve().parent.parent / "data" / "lemonade"
REGISTRY = DATA / "server_models.json"


def _ryzenai() -> dict:
    return {k: v for k, v in json.loads(REGISTRY.read_text()).items() if v.get("recipe") == "ryzenai-llm"}


def test_the_registry_copy_is_lemonades_file():
    prov = json.loads((DATA / "provenance.json").read_text())
    import hashlib

    assert hashlib.sha256(REGISTRY.read_bytes()).hexdigest() == prov["sha256"]
    assert prov["repository"] == "lemonade-sdk/lemonade" and len(prov["commit"]) == 40
    assert len(_ryzenai()) == 79


def test_models_of_both_registries_and_where_each_is_read(tmp_path):
    config = tmp_path / "lemonade-config"
    config.mkdir()
    local = make_package(tmp_path / "mine", "1.8.0-npu-4K")
    (config / "user_models.json").write_text(json.dumps({
        "My-NPU": {"checkpoint": str(local), "recipe": "ryzenai-llm", "source": "local_path"},
        "My-GGUF": {"checkpoint": "x/y:Q4", "recipe": "llamacpp"}}))
    found = models(REGISTRY, config)
    assert [m.name for m in found] == [*_ryzenai(), "user.My-NPU"]
    cache = tmp_path / "cache"
    snap = cache / "models--amd--Llama-3.2-1B-Instruct-onnx-ryzenai-npu" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("a" * 40)
    where = {m.name: (m.where, m.target) for m in locate(found, cache)}
    assert where["Llama-3.2-1B-Instruct-NPU"] == ("cache", str(snap))
    assert where["Qwen3-4B-Hybrid"] == ("hub", "hf://amd/Qwen3-4B-awq-quant-onnx-ryzenai-1.7-hybrid")
    assert where["user.My-NPU"] == ("local", str(local))


def test_builtin_registry_found_under_lemonades_install_prefix(tmp_path):
    home = tmp_path / "home"
    file = home / ".local/share/lemonade-server/resources/server_models.json"
    file.parent.mkdir(parents=True)
    file.write_text("{}")
    assert builtin_file({"HOME": str(home)}, "linux") == file
    assert builtin_file({}, "win32") is None


def test_lemonades_model_folder_is_its_models_dir_else_the_hugging_face_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))  # what huggingface_hub resolved from HF_HUB_CACHE / HF_HOME
    assert models_dir(tmp_path) == tmp_path / "hf"  # no config.json: lemonade's default, auto
    (tmp_path / "config.json").write_text(json.dumps({"models_dir": "auto"}))
    assert models_dir(tmp_path) == tmp_path / "hf"
    (tmp_path / "config.json").write_text(json.dumps({"models_dir": str(tmp_path / "models")}))
    assert models_dir(tmp_path) == tmp_path / "models"
    (tmp_path / "config.json").write_text(json.dumps({"models_dir": "models"}))
    with pytest.raises(UsageError, match="relative to its own executable"):
        models_dir(tmp_path)


def test_validate_lemonade_prints_a_row_per_model(tmp_path):
    cached = make_package(tmp_path / "src-cached", "1.6-npu")  # Llama-3.2-1B-Instruct-onnx-ryzenai-npu, as lemonade lists it
    hybrid = rebuild("SmolLM2-135M-Instruct-onnx-ryzenai-1.7-hybrid", tmp_path / "src-hub")
    config = tmp_path / "lemonade-config"
    config.mkdir()
    local = make_package(tmp_path / "mine", "1.8.0-npu-4K")
    (config / "user_models.json").write_text(json.dumps({"My-NPU": {"checkpoint": str(local), "recipe": "ryzenai-llm", "source": "local_path"}}))
    with FakeHub() as fake:
        fake.repos[f"amd/{cached.name}"] = Repo.from_folder(cached)
        fake.repos[f"amd/{hybrid.name}"] = served_repo(hybrid)
        env = env_for(tmp_path, fake, HF_HUB_CACHE=str(tmp_path / "hub-cache"))
        snapshot_download(env, f"amd/{cached.name}")
        done = subprocess.run([sys.executable, "-m", "raipack.cli", "validate", "--lemonade", "--lemonade-models", str(REGISTRY),
                               "--lemonade-config", str(config), "--jobs", "2"], env=env, capture_output=True, text=True, timeout=600)
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line and not line.startswith(" ")}
    names = [*_ryzenai(), "user.My-NPU"]
    assert all(name in rows for name in names), done.stdout[-3000:] + done.stderr[-2000:]
    assert " cache " in rows["Llama-3.2-1B-Instruct-NPU"] and "1.6-npu" in rows["Llama-3.2-1B-Instruct-NPU"]
    assert " hub " in rows["SmolLM2-135M-Instruct-Hybrid"] and "1.7" in rows["SmolLM2-135M-Instruct-Hybrid"]
    assert " local " in rows["user.My-NPU"] and "1.8.0-npu-4K" in rows["user.My-NPU"] and rows["user.My-NPU"].rstrip().endswith("ok")
    assert "not judged: hf://amd/Qwen3-4B-awq-quant-onnx-ryzenai-1.7-hybrid does not exist on the Hub" in rows["Qwen3-4B-Hybrid"]
    assert done.returncode in (1, 4) and "Traceback" not in done.stderr
    assert os.environ.get("HF_HUB_CACHE") != str(tmp_path / "hub-cache")  # the run's cache was the test's own
