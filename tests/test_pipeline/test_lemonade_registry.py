"""`raipack lemonade register` against a hostile or busy user_models.json (issue 37, item 7 and its low
items): concurrent registrations each keep their entry (a lock file beside the registry), a
symbolic link is written through, a FIFO or folder at the registry path is refused without
blocking, NaN, Infinity, numbers out of a double's range, duplicate keys and deep nesting are
refused (the file is left as it was), an uncreatable --config-dir is one sentence, and a package
folder's name with terminal escapes is printed escaped."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import threading

import pytest

from helpers import run_cli
from raipack import lemonade


@pytest.fixture
def amd_pkg(make_pkg):
    return make_pkg("1.8.0-npu-16K")


def _register(args) -> str:
    package, conf, name = args
    lemonade.register(package, name, config=conf)
    return name


def test_thirty_concurrent_registrations_keep_every_entry(amd_pkg, tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "user_models.json").write_text(json.dumps({"kept": {"checkpoint": "x", "recipe": "llamacpp"}}))
    monkeypatch.setattr(lemonade, "check_package", lambda package, allow_reference: None)  # the validation is tested elsewhere: here the race
    real_write = lemonade.atomic_write_bytes

    def slow_write(*a, **kw):  # widen the read-modify-write window as a busy disk does
        import time

        time.sleep(0.01)
        real_write(*a, **kw)

    monkeypatch.setattr(lemonade, "atomic_write_bytes", slow_write)
    names = [f"m{i:02d}" for i in range(30)]
    with multiprocessing.get_context("fork").Pool(6) as pool:  # six processes at a time, as in the issue
        done = pool.map(_register, [(amd_pkg, conf, n) for n in names], chunksize=1)
    assert done == names
    doc = json.loads((conf / "user_models.json").read_text())
    assert sorted(doc) == sorted(names + ["kept"])  # 21 of 31 survived before
    assert sorted(p.name for p in conf.iterdir()) == ["user_models.json", "user_models.json.lock"]  # no temporary file left


def test_a_held_lock_makes_a_registration_wait_then_write(amd_pkg, tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    conf.mkdir()
    target = conf / "user_models.json"
    monkeypatch.setattr(lemonade, "check_package", lambda package, allow_reference: None)
    with lemonade.locked(target):
        worker = threading.Thread(target=lemonade.register, args=(amd_pkg, "late"), kwargs={"config": conf})
        worker.start()
        worker.join(0.5)
        assert worker.is_alive() and not target.exists()  # waiting on the lock, not writing
    worker.join(30)
    assert "late" in json.loads(target.read_text())


def test_a_symlinked_registry_is_written_through_and_stays_a_link(amd_pkg, tmp_path, capsys):
    conf, dotfiles = tmp_path / "conf", tmp_path / "dotfiles"
    conf.mkdir()
    dotfiles.mkdir()
    (dotfiles / "user_models.json").write_text(json.dumps({"other": {"checkpoint": "x", "recipe": "llamacpp"}}))
    (conf / "user_models.json").symlink_to(dotfiles / "user_models.json")
    code, _, err = run_cli(capsys, "lemonade", "register", amd_pkg, "--config-dir", conf, "--name", "mine")
    assert code == 0, err
    assert (conf / "user_models.json").is_symlink()  # replaced by a plain file before
    assert sorted(json.loads((dotfiles / "user_models.json").read_text())) == ["mine", "other"]


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_registry_that_is_not_a_regular_file_is_refused_without_blocking(amd_pkg, tmp_path, capsys, kind):
    conf = tmp_path / "conf"
    conf.mkdir()
    registry = conf / "user_models.json"
    os.mkfifo(registry) if kind == "fifo" else registry.mkdir()
    for extra in ([], ["--dry-run"]):
        result: dict = {}
        worker = threading.Thread(target=lambda result=result, extra=extra: result.update(ran=run_cli(None, "lemonade", "register", amd_pkg, "--config-dir", conf, *extra)),
                                  daemon=True)
        worker.start()
        worker.join(30)
        assert not worker.is_alive(), "register blocked on the registry path"  # opening the FIFO blocked forever before
        code, _, err = result["ran"]
        assert code == 1 and "is not a regular file" in err, err
    assert stat.S_ISFIFO(registry.lstat().st_mode) if kind == "fifo" else registry.is_dir()


@pytest.mark.parametrize("content, said", [
    ('{"a": {"size": NaN}}', "NaN, which is not a JSON number"),
    ('{"a": {"size": -Infinity}}', "-Infinity, which is not a JSON number"),
    ('{"a": {"size": 1e999}}', "1e999, which is out of a double's range"),
    ('{"a": {"checkpoint": "x"}, "a": {"checkpoint": "y"}}', "the key 'a' twice in one object"),
    ('{"a": {"labels": {"x": 1, "x": 2}}}', "the key 'x' twice in one object"),
    ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested deeper than raipack's JSON reader takes"),
])
def test_a_registry_json_does_not_hold_is_refused_and_kept(amd_pkg, tmp_path, capsys, content, said):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "user_models.json").write_text(content)
    code, _, err = run_cli(capsys, "lemonade", "register", amd_pkg, "--config-dir", conf)
    assert code == 1 and said in err and "does not overwrite it" in err and "Traceback" not in err, err
    assert (conf / "user_models.json").read_text() == content  # NaN/Infinity were written back before, duplicates dropped


def test_an_uncreatable_config_dir_is_one_sentence(amd_pkg, tmp_path, capsys):
    dangling = tmp_path / "gone"
    dangling.symlink_to(tmp_path / "nowhere")  # the registry reads as absent; the folder cannot be made
    code, _, err = run_cli(capsys, "lemonade", "register", amd_pkg, "--config-dir", dangling / "lemonade")
    assert code == 1 and "Traceback" not in err, err  # FileExistsError from mkdir before
    assert f"cannot create lemonade's config folder {dangling / 'lemonade'}" in err and "--config-dir" in err


def test_a_folder_name_with_terminal_escapes_is_printed_escaped(make_pkg, tmp_path, capsys):
    pkg = make_pkg("1.8.0-npu-16K")
    odd = pkg.with_name("evil\x1b]0;pwned\x07\x1b[2J")
    pkg.rename(odd)
    conf = tmp_path / "conf"
    code, out, err = run_cli(capsys, "lemonade", "register", odd, "--config-dir", conf)
    assert code == 0, err
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert "user.evil\\x1b]0;pwned\\x07\\x1b[2J written to" in err
    assert "evil\x1b]0;pwned\x07\x1b[2J" in json.loads((conf / "user_models.json").read_text())  # the entry keeps the real name
