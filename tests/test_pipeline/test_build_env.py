"""`raipack build` sets OpenMP's wait policy before anything can load torch (OpenMP reads it once)."""

from __future__ import annotations

import os
import subprocess
import sys

SNIPPET = (
    "import os, sys\n"
    "from raipack.cli import main\n"
    "try:\n"
    "    main(['build', sys.argv[1]])\n"
    "except SystemExit as exc:\n"
    "    print(exc.code)\n"
    "print(os.environ.get('OMP_WAIT_POLICY'))\n"
)


def _run(tmp_path, **env):
    base = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    proc = subprocess.run([sys.executable, "-c", SNIPPET, str(tmp_path / "no-such-model")], env={**base, **env, "RAIPACK_CACHE": str(tmp_path / "c")},
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    return proc.stdout.split()


def test_build_sets_a_sleeping_wait_policy_even_for_a_refused_model(tmp_path):
    code, policy = _run(tmp_path)
    assert code == "2" and policy == "PASSIVE"  # the model check refused the folder; the policy was set first


def test_a_users_own_wait_policy_is_kept(tmp_path):
    assert _run(tmp_path, OMP_WAIT_POLICY="ACTIVE")[1] == "ACTIVE"
