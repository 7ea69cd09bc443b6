"""One NPU-readiness answer (pipeline/runtime/readiness.py): the smoke stage, `raipack bench`, `raipack eval`
and `raipack doctor` asked on the same fake machine about the same package say the same thing."""

from __future__ import annotations

import pytest

from fake_machine import fake_machine, fake_oga
from helpers import edit_json
from raipack import doctor
from raipack.benchmark import npu_ready
from raipack.evaluation.backends import npu_problem
from raipack.npu.settings import INSTALL_ENV
from raipack.runtime.provider import EP_ENV, LIBRARY
from raipack.runtime.readiness import ORDER, npu_readiness
from raipack.stages.smoke.npu import try_npu

MACHINES = {
    "no provider library": ({}, "no RyzenAI provider library found"),
    "no NPU": ({"npu": False}, "no NPU here"),
    "library does not load": ({"loads": False}, "does not load"),
    "OGA without RyzenAI": ({"known": False}, "Unknown provider name 'RyzenAI'"),
    "package names a library": ({}, "custom operator library"),
    "ready": ({}, ""),
}


def answers(pkg) -> dict:
    """(ready, reason) from each of the four, as each of them says it."""
    attempt = try_npu(pkg, [[1, 2, 3]], 2)
    env, why = npu_ready(pkg, None)
    eval_says = npu_problem(pkg)
    report = doctor.doctor(pkg)
    said = report.environment["npu_readiness"]
    return {
        "smoke": (attempt.ok, "" if attempt.ok else attempt.reason),
        "bench": (env is not None, why),
        "eval": (eval_says.startswith("the NPU could run it"), "" if eval_says.startswith("the NPU could run it") else eval_says),
        "doctor": (said["ready"], said["reason"]),
    }, report


@pytest.mark.parametrize("machine", list(MACHINES))
def test_smoke_bench_eval_and_doctor_give_one_answer(machine, make_pkg, tmp_path, monkeypatch):
    fakes, words = MACHINES[machine]
    monkeypatch.delenv(EP_ENV, raising=False)
    monkeypatch.delenv(INSTALL_ENV, raising=False)
    fake_machine(monkeypatch, **fakes)
    pkg = make_pkg("1.8.0-npu-16K")
    if machine != "no provider library":
        lib = tmp_path / "ryzenai" / LIBRARY
        lib.parent.mkdir()
        lib.write_bytes(b"")  # found; its loading is the fake probe's answer
        monkeypatch.setenv(EP_ENV, str(lib))
    if machine == "package names a library":
        edit_json(pkg / "genai_config.json", lambda d: d["model"]["decoder"]["session_options"].update(custom_ops_library="ops.so"))
    if machine == "ready":
        monkeypatch.setenv("PYTHONPATH", str(fake_oga(tmp_path)))  # the smoke child imports it; nothing in-process does

    expected = npu_readiness(pkg)
    said, report = answers(pkg)
    assert expected.ready is (machine == "ready") and words in expected.reason, expected
    assert set(said.values()) == {(expected.ready, expected.reason)}, said
    if machine == "ready":
        assert [c.name for c in expected.checks] == list(ORDER) and report.ready, [p.line() for p in report.findings]
    elif machine == "package names a library":  # AMD's runtime may still run it: doctor warns
        assert any(p.code == "DR107" and expected.reason in p.message for p in report.findings)
    else:
        assert not report.ready and any(p.severity == "error" and expected.reason in p.message for p in report.findings), [p.line() for p in report.findings]


def test_nothing_is_loaded_while_a_static_check_fails(make_pkg, tmp_path, monkeypatch):
    """A package naming a library stops the answer before any probe that loads something runs."""
    calls = []
    fake_machine(monkeypatch)
    from raipack.runtime import probes

    monkeypatch.setattr(probes, "library_loads", lambda path: calls.append(path) or (True, ""))
    pkg = make_pkg("1.8.0-npu-16K")
    edit_json(pkg / "genai_config.json", lambda d: d["model"]["decoder"]["session_options"].update(custom_ops_library="ops.so"))
    lib = tmp_path / LIBRARY
    lib.write_bytes(b"")
    monkeypatch.setenv(EP_ENV, str(lib))
    answer = npu_readiness(pkg)
    assert not answer.ready and [c.name for c in answer.checks] == ["provider_library", "package"] and calls == []
    every = npu_readiness(pkg, every=True)  # doctor asks every check; the verdict is the same
    assert [c.name for c in every.checks] == list(ORDER) and every.reason == answer.reason and calls == [lib.resolve()]
