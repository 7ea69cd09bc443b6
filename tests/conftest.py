import os
import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).parent))  # factory, helpers; appended so tests/pipeline never shadows pipeline

from factory import REFERENCE_DIR_ENV, make_package, reference_key, reference_package  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def reference_dir(tmp_path_factory):
    """Where factory.reference_package() builds the real reference packages, on first use: one folder
    per test run and content, shared by the pytest-xdist workers (the first builds, under a file lock)
    and, through the environment, by the subprocesses tests start."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "reference-packages" / reference_key()
    old = os.environ.get(REFERENCE_DIR_ENV)
    os.environ[REFERENCE_DIR_ENV] = str(folder)
    yield folder
    if old is None:
        os.environ.pop(REFERENCE_DIR_ENV, None)
    else:
        os.environ[REFERENCE_DIR_ENV] = old


@pytest.fixture(scope="session")
def reference_packages(reference_dir):
    """profile id -> the real fused package of every reference profile (read-only), built now: for
    tests that time a build and must not pay for this one inside it."""
    from pipeline.npu.profile import all_profiles

    return {pid: reference_package(pid) for pid, p in all_profiles().items() if p["target"] == "reference"}


@pytest.fixture
def make_pkg(tmp_path):
    """make_pkg(profile_id, **kw) -> a fresh package folder that validates clean (a reference
    profile's is a copy of a real fused package)."""
    counter = iter(range(1000))

    def make(profile_id: str, **kw):
        return make_package(tmp_path / f"p{next(counter)}", profile_id, **kw)

    return make
