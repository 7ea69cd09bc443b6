"""What the tests build is removed when a test passes (issue 40: one `make test` left 17 GB in the system
temp folder): pytest's tmp_path_retention_policy = "failed" (pyproject.toml), and tests/conftest.py makes
the read-only folders of sealed cache entries writable first, which pytest's removal skipped."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import conftest

REPO = Path(__file__).resolve().parents[1]


def _read_only_tree(root: Path) -> Path:
    entry = root / "cache" / "entry"
    (entry / "sub").mkdir(parents=True)
    (entry / "sub" / "model.onnx").write_bytes(b"x" * 1000)
    (entry / "manifest.json").write_text("{}")
    for folder in (entry / "sub", entry):
        folder.chmod(0o500)
    return entry


def test_read_only_folders_become_removable(tmp_path):
    entry = _read_only_tree(tmp_path)
    conftest.writable(tmp_path)
    assert os.stat(entry).st_mode & 0o700 == 0o700 and os.stat(entry / "sub").st_mode & 0o700 == 0o700
    for p in sorted(tmp_path.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()  # would raise PermissionError on a read-only folder's files


def test_the_retention_policy_keeps_only_what_failed(pytestconfig):
    assert pytestconfig.getini("tmp_path_retention_policy") == "failed"


def test_a_run_leaves_only_the_failed_tests_folders(tmp_path):
    """An inner pytest with this repository's configuration and conftest, its system temp folder its own."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_inner.py").write_text(textwrap.dedent("""
        import os
        from pathlib import Path

        def _sealed(root):
            entry = root / "entry"
            entry.mkdir()
            (entry / "model.bin").write_bytes(b"x" * 100_000)
            entry.chmod(0o500)

        def test_passes(tmp_path):
            _sealed(tmp_path)

        def test_fails(tmp_path):
            _sealed(tmp_path)
            (tmp_path / "FAILED_HERE").write_text("")
            assert False
        """))
    system_tmp = tmp_path / "tmp"
    system_tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(system_tmp), PYTHONPATH=str(REPO / "tests"))
    env.pop(conftest.tiers.TIER_ENV, None)
    run = subprocess.run([sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(REPO / "pyproject.toml"),
                          "--rootdir", str(tmp_path), "-p", "conftest", str(tmp_path / "tests" / "test_inner.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert "1 failed, 1 passed" in run.stdout, run.stdout + run.stderr
    left = [p for p in system_tmp.rglob("*") if p.is_file()]
    assert [p.name for p in left if p.name != "model.bin"] == ["FAILED_HERE"] and len(left) == 2, left
    conftest.writable(system_tmp)  # the inner run's failed folder, read-only: tmp_path can go
