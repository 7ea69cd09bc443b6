"""raipack.builder.swap: the final name never holds a partial folder, with and without RENAME_EXCHANGE."""

import ctypes
import errno
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


RENAME_EXCHANGE = 1 << 1  # linux/fs.h, written here on its own: a wrong constant in swap.py must fail this test
UNSUPPORTED = {errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}  # the kernel or the filesystem has no RENAME_EXCHANGE


def _renameat2_errno(a, b) -> int | None:
    """What renameat2(a, b, RENAME_EXCHANGE) answers, called here rather than through swap: 0 when it
    swapped, an errno when it refused, None when the C library has no renameat2."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    return 0 if fn(-100, os.fsencode(a), -100, os.fsencode(b), RENAME_EXCHANGE) == 0 else ctypes.get_errno()  # -100: AT_FDCWD


def test_exchange_is_used_on_linux(tmp_path):
    """Skips only where the platform has no exchange (no renameat2, ENOSYS, EOPNOTSUPP); any other refusal
    (EINVAL from a wrong flag, EPERM) fails, as does swap._exchange saying no where renameat2 can."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "x").write_text("a")
    if not swap._exchange(a, b):
        err = _renameat2_errno(a, b)
        if err is None or err in UNSUPPORTED:
            pytest.skip(f"renameat2(RENAME_EXCHANGE) is not available here ({errno.errorcode.get(err or 0, 'no renameat2')}); the fallback is tested above")
        pytest.fail(f"swap._exchange returned False, but renameat2(RENAME_EXCHANGE) here answers "
                    f"{errno.errorcode.get(err, err) if err else 'success'}: swap.py's call or constants are wrong")
    assert (b / "x").read_text() == "a" and not (a / "x").exists()
    assert swap._RENAME_EXCHANGE == RENAME_EXCHANGE


def test_a_wrong_flag_fails_instead_of_skipping(tmp_path, monkeypatch):
    """The defect this test had: EINVAL from a wrong flag made _exchange return False and the test skip."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    if _renameat2_errno(a, b) != 0:
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    monkeypatch.setattr(swap, "_RENAME_EXCHANGE", 1 << 7)  # no such flag: EINVAL
    (tmp_path / "again").mkdir()
    with pytest.raises(pytest.fail.Exception, match="answers success"):
        test_exchange_is_used_on_linux(tmp_path / "again")


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
