import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).parent))  # factory, helpers; appended so tests/pipeline never shadows pipeline

from factory import make_package  # noqa: E402


@pytest.fixture
def make_pkg(tmp_path):
    """make_pkg(profile_id, **kw) -> a fresh package folder that validates clean."""
    counter = iter(range(1000))

    def make(profile_id: str, **kw):
        return make_package(tmp_path / f"p{next(counter)}", profile_id, **kw)

    return make
