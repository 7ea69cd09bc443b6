"""200+ generated malformed packages: always a finding or a usage error, never a traceback, never exit 0."""

from __future__ import annotations

import json
import os
import random
import shutil

import pytest

from factory import lfs_pointer_text
from helpers import edit_json
from raipack.cli import main
from raipack.npu.profile import all_profiles

PROFILES = sorted(p for p, v in all_profiles().items() if v.target != "intermediate") + ["oga-export", "quark-export"]
N = 210
BUILT = {p for p, v in all_profiles().items() if v.target == "reference" or p == "ort-model-package"}.__contains__  # their packages copy a real build
BAD_VALUES = ["oops", -1, None, [1, 2], {"a": 1}, 1.5, True]
GENAI_NUMERIC = [("model", "vocab_size"), ("model", "context_length"), ("model", "decoder", "num_hidden_layers"), ("model", "decoder", "head_size"),
                 ("model", "decoder", "num_key_value_heads"), ("model", "decoder", "num_attention_heads"), ("search", "max_length"), ("search", "num_beams")]


def _files(pkg, pred):
    return sorted(p for p in pkg.rglob("*") if p.is_file() and not p.is_symlink() and pred(p))


def m_truncate_json(pkg, rng):
    path = rng.choice(_files(pkg, lambda p: p.suffix == ".json" and p.stat().st_size > 2))  # AMD's hybrid config.json is "{}"
    data = path.read_bytes()
    path.write_bytes(data[: rng.randrange(1, len(data) - 1)])
    return "m_truncate_json"


def m_non_utf8(pkg, rng):
    path = rng.choice(_files(pkg, lambda p: p.suffix == ".json" and p.stat().st_size > 2))
    data = bytearray(path.read_bytes())
    data[rng.randrange(1, len(data) - 1)] = rng.choice([0xFF, 0xFE, 0xC3])
    path.write_bytes(bytes(data))
    return "m_non_utf8"


def m_lfs(pkg, rng):
    path = rng.choice(_files(pkg, lambda p: p.suffix in (".bin", ".data", ".onnx", ".safetensors", ".json") and p.name != "manifest.json"))
    path.write_text(lfs_pointer_text(path.stat().st_size + 1))
    return "m_lfs"


def m_delete_required(pkg, rng, profile):
    patterns = [*profile.files.required, *(g[0] for g in profile.files.required_one_of if len(g) == 1)]
    names = [p for p in patterns if "*" not in p and (pkg / p).exists()]
    target = pkg / rng.choice(names)
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    return "m_delete_required"


def m_wrong_type(pkg, rng):
    if not (pkg / "genai_config.json").exists():
        return m_truncate_json(pkg, rng)
    keys = rng.choice(GENAI_NUMERIC)
    bad = rng.choice(["oops", -1, None, [1, 2], {"a": 1}, 1.5, True])

    def fn(d):
        node = d
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = bad

    edit_json(pkg / "genai_config.json", fn)
    return "m_wrong_type"


def m_json_to_folder(pkg, rng):
    path = rng.choice([p for p in _files(pkg, lambda p: p.name in ("genai_config.json", "config.json", "rai_config.json"))])
    path.unlink()
    path.mkdir()
    (path / "x").write_text("{}")
    return "m_json_to_folder"


def m_truncate_data(pkg, rng):
    datas = _files(pkg, lambda p: p.name.endswith(".data"))
    if not datas:
        return m_lfs(pkg, rng)
    path = rng.choice(datas)
    with open(path, "r+b") as fh:
        fh.truncate(rng.randrange(0, max(1, path.stat().st_size // 2)))
    return "m_truncate_data"


def m_option(pkg, rng):
    genai = pkg / "genai_config.json"
    doc = json.loads(genai.read_text()) if genai.exists() else {}
    so = doc.get("model", {}).get("decoder", {}).get("session_options", {})
    blocks = [b["RyzenAI"] for b in so.get("provider_options", []) if "RyzenAI" in b] or ([so["config_entries"]] if so.get("config_entries") else [])
    if not blocks or not blocks[0]:
        return m_wrong_type(pkg, rng)
    key = rng.choice(sorted(blocks[0]))
    blocks[0][key] = rng.choice([4096, 1.0, None, ["npu"], {"x": "y"}])
    genai.write_text(json.dumps(doc))
    return "m_option"


def m_garbage_graph(pkg, rng):
    graphs = _files(pkg, lambda p: p.suffix == ".onnx")
    if not graphs:
        return m_truncate_json(pkg, rng)
    rng.choice(graphs).write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400))))
    return "m_garbage_graph"


def m_symlink_out(pkg, rng):
    path = rng.choice(_files(pkg, lambda p: True))
    path.unlink()
    os.symlink("/etc/hostname", path)
    return "m_symlink_out"


def m_huge_json(pkg, rng):
    path = rng.choice(_files(pkg, lambda p: p.name in ("genai_config.json", "config.json", "tokenizer.json")))
    with open(path, "r+b") as fh:
        fh.truncate(2 * 1024**3)  # 2 GiB, sparse: must be refused without reading it
    return "m_huge_json"


def m_loop(pkg, rng):
    os.symlink(pkg / "loop_b", pkg / "loop_a")
    os.symlink(pkg / "loop_a", pkg / "loop_b")
    return "m_loop"


MUTATIONS = [m_truncate_json, m_non_utf8, m_lfs, m_delete_required, m_wrong_type, m_json_to_folder, m_truncate_data, m_option, m_garbage_graph, m_symlink_out, m_huge_json, m_loop]
# Each mutator returns the mutation it applied. It falls back to another only where the
# package has nothing to mutate its way; these are all such places, checked by every seed.
FALLBACKS = {
    ("m_option", "1.3-hybrid"): "m_wrong_type",  # no RyzenAI provider options, no config_entries
    ("m_option", "1.3-npu"): "m_wrong_type",
    ("m_option", "1.6-hybrid"): "m_wrong_type",
    ("m_option", "oga-export"): "m_wrong_type",
    ("m_option", "quark-export"): "m_truncate_json",  # no genai_config.json
    ("m_wrong_type", "quark-export"): "m_truncate_json",
    ("m_truncate_data", "quark-export"): "m_lfs",  # no external data
    ("m_garbage_graph", "quark-export"): "m_truncate_json",  # no ONNX graph
}


@pytest.mark.parametrize("seed", [pytest.param(s, marks=pytest.mark.builds) if BUILT(PROFILES[s % len(PROFILES)]) else s
                                  for s in range(N)])  # a reference profile's package is a copy of a real build (tests/tiers.py)
def test_malformed_package_fails_cleanly(make_pkg, capsys, seed):
    rng = random.Random(seed)
    profile_id = PROFILES[seed % len(PROFILES)]
    mutation = MUTATIONS[(seed // len(PROFILES) + seed) % len(MUTATIONS)]
    pkg = make_pkg(profile_id)
    args = ["validate", "--format", "json", str(pkg)]
    if mutation is m_delete_required:
        applied = mutation(pkg, rng, all_profiles()[profile_id])
        args += ["--profile", profile_id]  # the deleted file may be the one that identified the profile
    else:
        applied = mutation(pkg, rng)
    assert applied == FALLBACKS.get((mutation.__name__, profile_id), mutation.__name__), f"{mutation.__name__} on {profile_id} fell back to {applied}"
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    code = exit_info.value.code
    assert code in (1, 2, 3), f"{mutation.__name__} on {profile_id}: exit {code}\n{out}{err}"
    if code == 1:
        report = json.loads(out)
        errors = [f for f in report["results"][0]["findings"] if f["severity"] == "error"]
        assert errors and all(f["message"] and f["hint"] for f in errors)
    else:
        assert err.startswith("ERROR: ") and "hint:" in err


def test_unreadable_file_is_a_finding(make_pkg, monkeypatch):
    """Root can read anything, so the permission error is simulated at open() and os.open()."""
    from raipack.validate import validate

    pkg = make_pkg("1.8.0-npu-16K")
    real_open, real_os_open = open, os.open
    target = os.path.realpath(pkg / "genai_config.json")

    def refuse(path):
        if not isinstance(path, int) and os.path.realpath(path) == target:
            raise PermissionError(13, "Permission denied")

    def guarded(path, *a, **kw):
        refuse(path)
        return real_open(path, *a, **kw)

    def guarded_os_open(path, *a, **kw):
        refuse(path)
        return real_os_open(path, *a, **kw)

    monkeypatch.setattr("builtins.open", guarded)
    monkeypatch.setattr("os.open", guarded_os_open)
    monkeypatch.setattr("pathlib.Path.read_bytes", lambda self: guarded(str(self), "rb").read())
    result = validate(pkg)
    assert any(f.path == "genai_config.json" and "Permission denied" in f.message for f in result.findings)
    assert result.failed()
