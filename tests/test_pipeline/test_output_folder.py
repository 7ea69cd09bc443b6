"""The folder a stage function writes into (raipack.core.output.output_folder): new or empty,
never replaced, left as it was when the writer fails. Staging and swapping are the runner's."""

from __future__ import annotations

import pytest

from raipack.core.errors import RaipackError
from raipack.core.output import output_folder


def test_a_missing_folder_is_created_and_written(tmp_path):
    with output_folder(tmp_path / "a" / "out") as out:
        (out / "x.txt").write_text("x")
    assert [p.name for p in (tmp_path / "a" / "out").iterdir()] == ["x.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # nothing beside it


@pytest.mark.parametrize("make", ["non-empty folder", "file", "symlink"])
def test_anything_but_a_new_or_empty_folder_is_refused_untouched(tmp_path, make):
    target = tmp_path / "out"
    if make == "non-empty folder":
        target.mkdir()
        (target / "mine.txt").write_text("a user's")
    elif make == "file":
        target.write_text("a user's")
    else:
        (tmp_path / "elsewhere").mkdir()
        target.symlink_to(tmp_path / "elsewhere")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with pytest.raises(RaipackError, match="out is not an empty folder") as err:
        with output_folder(target):
            raise AssertionError("the body must not run")
    assert err.value.hint
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("exists", [False, True])
def test_a_failing_writer_leaves_the_folder_as_it_was(tmp_path, exists):
    target = tmp_path / "out"
    if exists:
        target.mkdir()
    with pytest.raises(KeyboardInterrupt):
        with output_folder(target) as out:
            (out / "half.bin").write_bytes(b"x")
            (out / "sub").mkdir()
            (out / "sub" / "part").write_bytes(b"y")
            raise KeyboardInterrupt
    assert target.exists() is exists
    assert not exists or list(target.iterdir()) == []
