"""Untrusted inputs: validation and build never run a package's code or unpickle its weights."""

from __future__ import annotations

import json
import pickle

import pytest

import numpy as np

from factory import write_safetensors
from pipeline.errors import UsageError
from pipeline.inputs import check_model_dir
from pipeline.validate import validate


class Boom:
    """Unpickling this runs os.system-like code: here it writes a marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def booby_trap(folder, marker_dir):
    (folder / "modeling_evil.py").write_text(f"open({str(marker_dir / 'imported')!r}, 'w').write('pwned')\n")
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(Boom(str(marker_dir / "unpickled"))))


def test_validate_never_runs_package_code(make_pkg, tmp_path):
    pkg = make_pkg("1.8.0-npu-16K")
    booby_trap(pkg, tmp_path)
    result = validate(pkg)
    assert not (tmp_path / "imported").exists() and not (tmp_path / "unpickled").exists()
    warned = {(f.check_id, f.path) for f in result.findings}
    assert ("RP105", "pytorch_model.bin") in warned and ("RP106", "modeling_evil.py") in warned


def hf_dir(tmp_path, **cfg):
    d = tmp_path / "model"
    d.mkdir()
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2}
    (d / "config.json").write_text(json.dumps({**base, **cfg}))
    return d


def test_build_input_with_remote_code_is_refused_without_running_it(tmp_path):
    d = hf_dir(tmp_path, auto_map={"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"})
    write_safetensors(d / "model.safetensors", {"w": np.zeros((2, 2), np.float32)})
    booby_trap(d, tmp_path)
    with pytest.raises(UsageError, match="auto_map") as info:
        check_model_dir(d)
    assert "--trust-remote-code" in info.value.hint
    assert not (tmp_path / "imported").exists() and not (tmp_path / "unpickled").exists()


def test_pickle_only_model_is_refused(tmp_path):
    d = hf_dir(tmp_path)
    booby_trap(d, tmp_path)
    with pytest.raises(UsageError, match="only pickle checkpoints"):
        check_model_dir(d)
    assert not (tmp_path / "unpickled").exists()


def test_unsupported_architecture_is_one_sentence(tmp_path):
    d = hf_dir(tmp_path, architectures=["MambaForCausalLM"])
    write_safetensors(d / "model.safetensors", {"w": np.zeros((2, 2), np.float32)})
    with pytest.raises(UsageError) as info:
        check_model_dir(d)
    assert "MambaForCausalLM" in str(info.value) and "LlamaForCausalLM" in str(info.value) and "\n" not in str(info.value)


def test_missing_input_is_one_sentence(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        check_model_dir(tmp_path / "nope")
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        check_model_dir(tmp_path / "f.txt")
