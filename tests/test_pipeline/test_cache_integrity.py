"""The stage cache cannot be corrupted through the package, an edited entry is never reused, and
killed builds leave nothing behind for long (issue 11, items 4 and 10). Fake stages: seconds."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import fake_build_env, fuse_entry, run_fake_build
from raipack.builder import cache, staging
from raipack.cli import main
from raipack.core import manifest

PKG = "SmolLM2-135M-Instruct_rai_1.8.0_npu_16K"
KEY = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def env(tmp_path, monkeypatch):
    return fake_build_env(tmp_path, monkeypatch)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def flip_in_place(path: Path) -> None:
    """Change bytes in the middle of a file without changing its size (an editor, a bad tool)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with open(path, "r+b") as fh:
        fh.write(data)
    assert path.stat().st_size == len(data)


def test_editing_the_package_leaves_the_cache_intact(env):
    run_fake_build()
    entry, pkg = fuse_entry(), env / "build" / PKG
    cached = entry / "model.onnx"
    recorded = {f["path"]: f["sha256"] for f in manifest.read(entry)["files"]}["model.onnx"]
    assert os.stat(pkg / "model.onnx").st_ino != os.stat(cached).st_ino  # storage of its own
    assert os.access(pkg / "model.onnx", os.W_OK) and stat.S_IMODE(os.stat(pkg / "model.onnx").st_mode) & 0o200

    flip_in_place(pkg / "model.onnx")
    assert sha(cached) == recorded
    statuses, _ = run_fake_build()
    assert set(statuses.values()) == {"cached"}
    assert sha(pkg / "model.onnx") == recorded  # the rebuilt package has the cached bytes again


def test_entries_are_sealed_read_only_and_clear_removes_them(env, capsys):
    run_fake_build()
    entries = [Path(e["path"]) for e in cache.entries()]
    assert len(entries) == 5
    for entry in entries:
        for dirpath, _dirnames, filenames in os.walk(entry):
            assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o555, dirpath
            for name in filenames:
                assert stat.S_IMODE(os.stat(Path(dirpath, name)).st_mode) == 0o444, name
    with pytest.raises(SystemExit) as info:
        main(["cache", "clear"])
    assert info.value.code == 0 and "removed 5 cached outputs" in capsys.readouterr().out
    assert cache.entries() == [] and not any(entry.exists() for entry in entries)


def test_an_entry_edited_in_place_is_detected_and_rebuilt(env):
    """Made writable, edited at the same size, mode and mtime put back: the ctime still tells."""
    run_fake_build()
    entry = fuse_entry()
    victim = entry / "model.onnx"
    before = os.stat(victim)
    os.chmod(victim, 0o644)
    flip_in_place(victim)
    os.chmod(victim, 0o444)
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(victim).st_mtime_ns == before.st_mtime_ns and os.stat(victim).st_size == before.st_size

    statuses, printed = run_fake_build()
    assert statuses["fuse"] == "built" and statuses["export"] == "cached"
    assert "cache: the fuse entry" in printed and "model.onnx no longer has the sha256" in printed
    rebuilt = fuse_entry()
    assert cache.changed_file(rebuilt, manifest.read(rebuilt)) is None
    assert sha(env / "build" / PKG / "model.onnx") == sha(rebuilt / "model.onnx")
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".")]  # the discarded entry is gone


def test_verify_cache_hashes_every_entry(env, monkeypatch, capsys):
    def verified_build() -> str:
        with pytest.raises(SystemExit) as info:
            main(["build", "--verify-cache", "--output", "build"])
        assert info.value.code == 0
        return capsys.readouterr().err

    run_fake_build()
    hashed = []
    real = cache.changed_file
    monkeypatch.setattr(cache, "changed_file", lambda path, doc: hashed.append(path.parent.name) or real(path, doc))
    assert "every stage is cached" in verified_build()
    assert hashed == ["source", "quantize", "export", "fuse", "smoke"]

    entry = fuse_entry()
    os.chmod(entry / "model.onnx", 0o644)
    flip_in_place(entry / "model.onnx")
    cache._stamp_path(entry).write_text(json.dumps(cache.stamp(entry)))  # a change the stat check cannot see
    assert cache.lookup("fuse", entry.name) == entry  # the stat check alone trusts it
    err = verified_build()
    assert "fuse entry" in err and "model.onnx no longer has the sha256" in err
    assert "✔ fuse      built" in err
    assert real(fuse_entry(), manifest.read(fuse_entry())) is None


# --------------------------------------------------------------------------- stale staging folders

HOLDER = """
import os, sys
from pathlib import Path
from raipack.builder import staging
root = Path(sys.argv[1])
staging.hold(root)
(root / "stages" / "export" / f".staging-{sys.argv[2]}-{os.getpid()}").mkdir(parents=True)
print("ready", flush=True)
sys.stdin.read()
"""


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


def leftovers(root: Path, stage: str, pid: int) -> list[Path]:
    """What a build killed inside a stage leaves: the runner's staging folder (and what stages of
    earlier raipack versions made beside it)."""
    folder = root / "stages" / stage
    made = [folder / f".staging-{KEY}-{pid}", folder / f"..staging-{KEY}-{pid}.cache-k2x9", folder / f"..staging-{KEY}-{pid}.tmp-a81c"]
    for item in made:
        (item / "sub").mkdir(parents=True)
        (item / "sub" / "weights.bin").write_bytes(b"\0" * 1000)
    return made


@pytest.fixture
def holder(env):
    """A live build in another process: it holds its lock and has a staging folder."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(env / "cache"), KEY], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc, env / "cache" / "stages" / "export" / f".staging-{KEY}-{proc.pid}"
    proc.kill()
    proc.wait()


def test_cache_clear_stale_removes_dead_builds_folders_only(env, holder, capsys):
    proc, live = holder
    root = env / "cache"
    dead = leftovers(root, "export", dead_pid()) + leftovers(root, "fuse", dead_pid())
    # a pid reused by a process that is not a build: its lock file is there but nobody holds it
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    (root / staging.LOCKS / str(other.pid)).write_text("")
    reused = leftovers(root, "quantize", other.pid)
    try:
        with pytest.raises(SystemExit) as info:
            main(["cache", "clear", "--stale"])
    finally:
        other.kill()
        other.wait()
    assert info.value.code == 0 and "removed 9 staging folders" in capsys.readouterr().out
    assert not [p for p in dead + reused if p.exists()]
    assert live.is_dir() and (root / staging.LOCKS / str(proc.pid)).exists()
    assert sorted(p.name for p in (root / staging.LOCKS).iterdir()) == [str(proc.pid)]

    proc.kill()  # however it dies, the kernel releases its lock
    proc.wait()
    with pytest.raises(SystemExit):
        main(["cache", "clear", "--stale"])
    assert not live.exists() and list((root / staging.LOCKS).iterdir()) == []


def test_every_build_start_sweeps_all_stages(env, holder):
    _, live = holder
    root = env / "cache"
    dead = leftovers(root, "export", dead_pid()) + leftovers(root, "smoke", dead_pid())
    run_fake_build(until="source")  # a build that runs neither export nor smoke
    assert not [p for p in dead if p.exists()]
    assert live.is_dir()
    assert not (root / staging.LOCKS / str(os.getpid())).exists()  # a finished build holds no lock


def test_stale_takes_no_stage(env, capsys):
    with pytest.raises(SystemExit) as info:
        main(["cache", "clear", "export", "--stale"])
    assert info.value.code == 2 and "takes no STAGE" in capsys.readouterr().err
