"""raipack.builder.swap: the final name never holds a partial folder, with and without RENAME_EXCHANGE."""

import os

import pytest

from raipack.builder import swap
from raipack.core import manifest


def finished(folder, text):
    folder.mkdir()
    (folder / "payload.txt").write_text(text)
    manifest.write(folder, "package")
    return folder


@pytest.mark.parametrize("exchange", [True, False])
def test_replace_dir_swaps_and_removes_the_old_folder(tmp_path, exchange):
    final = finished(tmp_path / "pkg", "old")
    new = finished(tmp_path / ".pkg.staging-1", "new")
    swap.replace_dir(new, final, exchange=exchange)
    assert (final / "payload.txt").read_text() == "new"
    assert manifest.is_complete(final)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]


def test_replace_dir_into_an_empty_name(tmp_path):
    new = finished(tmp_path / ".pkg.staging-1", "new")
    swap.replace_dir(new, tmp_path / "pkg")
    assert (tmp_path / "pkg" / "payload.txt").read_text() == "new"


def test_exchange_is_used_on_linux(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "x").write_text("a")
    if not swap._exchange(a, b):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available on this platform; the fallback is tested above")
    assert (b / "x").read_text() == "a" and not (a / "x").exists()


def test_recover_puts_back_a_folder_left_aside_by_a_killed_run(tmp_path):
    """The fallback renames the old folder aside; a kill right then must not lose it."""
    final = tmp_path / "pkg"
    aside = finished(tmp_path / ".pkg.old-999999", "old")
    swap.recover(final, alive=lambda pid: False)
    assert (final / "payload.txt").read_text() == "old" and not aside.exists()


def test_recover_drops_an_aside_folder_when_the_name_is_taken(tmp_path):
    final = finished(tmp_path / "pkg", "current")
    aside = finished(tmp_path / ".pkg.old-999999", "old")
    live = finished(tmp_path / f".pkg.old-{os.getpid()}", "in use")
    swap.recover(final, alive=lambda pid: pid == os.getpid())
    assert (final / "payload.txt").read_text() == "current"
    assert not aside.exists() and live.exists()
