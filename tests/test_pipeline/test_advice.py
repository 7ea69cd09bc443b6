"""Each advice check fires on a package tuned its way and stays quiet on AMD's settings."""

from __future__ import annotations

import json

import pytest

from helpers import edit_json, ryzen
from raipack.checks import load_all
from raipack.cli import main
from raipack.npu.profile import all_profiles
from raipack.validate import validate

P16, P4, P16_OLD, HYBRID = "1.8.0-npu-16K", "1.8.0-npu-4K", "1.7.1-npu-16K", "1.8.0-hybrid"
GENAI = "genai_config.json"


def advice(result) -> list:
    return [f for f in result.findings if f.severity == "advice"]


def _opt(key, value):
    """Set a RyzenAI option (None removes it)."""
    return lambda pkg: edit_json(pkg / GENAI, lambda d: [ryzen(d).pop(key) if value is None else ryzen(d).__setitem__(key, value), None][1])


def _search(**values):
    def fn(doc):
        for key, value in values.items():
            if value is None:
                doc["search"].pop(key)
            else:
                doc["search"][key] = value
    return lambda pkg: edit_json(pkg / GENAI, fn)


def _rai(version, n):
    return lambda pkg: edit_json(pkg / "rai_config.json", lambda d: d["max_prompt_length"].__setitem__(version, n))


def _gen(**values):
    return lambda pkg: edit_json(pkg / "generation_config.json", lambda d: d.update(values))


def _both(*mutations):
    def mutate(pkg):
        for m in mutations:
            m(pkg)
    return mutate


def _nothing(pkg):
    pass


# id, profile, mutation, check, words the message must hold (setting, current value, recommended value)
TRIGGERS = [
    ("backend-gpu", P16, _opt("hybrid_opt_token_backend", "gpu"), "RP001", ["hybrid_opt_token_backend", "'gpu'", '"npu"', "falls back"]),
    ("backend-missing", P4, _opt("hybrid_opt_token_backend", None), "RP001", ["hybrid_opt_token_backend", "missing", '"npu"']),
    ("fusion-off", P16, _opt("fusion_opt_io_bind_kv_cache", "0"), "RP002", ["fusion_opt_io_bind_kv_cache", "'0'", '"1"', "largest decode speed-up"]),
    ("fusion-missing", P4, _opt("fusion_opt_io_bind_kv_cache", None), "RP002", ["fusion_opt_io_bind_kv_cache", "missing", '"1"']),
    ("share-buffer-false", P16, _search(past_present_share_buffer=False), "RP003", ["past_present_share_buffer", "false", "recommended true", "memory"]),
    ("chunking-off", P4, _both(_opt("hybrid_opt_chunk_context", "0"), _opt("hybrid_opt_max_seq_length", "2048")), "RP004", ["hybrid_opt_chunk_context", "'0'", "4096", "2048", '"1"']),
    ("not-multiple", P16, _search(max_length=10000), "RP005", ["max_length is 10000", "chunk_size 4096", "recommended 8192"]),
    ("far-above", P4, _search(max_length=16384), "RP005", ["max_length is 16384", "MiB of KV cache", "4096"]),
    ("sdk-prompt", P4, lambda pkg: None, "RP006", ["4096", "Ryzen AI 1.5.1", "2048", "falls back"]),
    ("beams", P16, _search(num_beams=4), "RP007", ["num_beams is 4", "recommended 1"]),
    ("temperature", P16, _search(temperature=1.5), "RP007", ["temperature is 1.5", "repetition"]),
    ("top-p-drift", HYBRID, _search(top_p=0.5), "RP007", ["top_p is 0.5", "0.9 in generation_config.json"]),
    ("drift-no-gen-config", P16, _both(_search(top_k=5), lambda pkg: (pkg / "generation_config.json").unlink()), "RP007", ["top_k is 5", "50", "defaults"]),
    ("prompt-above-tier", P16, _rai("1.8.0", 2100), "RP008", ["2100", "tier 2048", "tier 3072", "972"]),
    ("chunk-above-tier", P16_OLD, _both(_search(chunk_size=1100, max_length=16500), _opt("hybrid_opt_max_seq_length", "1024")), "RP008", ["chunk_size is 1100", "tier 1024", "1536"]),
]

# the same checks stay quiet where the setting is AMD's, or the advice does not apply
QUIET = [
    ("backend-npu", P16, _nothing, "RP001"),
    ("backend-hybrid-gpu", HYBRID, _opt("hybrid_opt_token_backend", "gpu"), "RP001"),  # a hybrid package decodes on the iGPU by design
    ("backend-invalid", P16, _opt("hybrid_opt_token_backend", "cpu"), "RP001"),  # RP403's error, not advice
    ("fusion-on", P4, _nothing, "RP002"),
    ("fusion-1.7.1", P16_OLD, _opt("fusion_opt_io_bind_kv_cache", None), "RP002"),  # 1.7.1 packages do without it
    ("share-buffer-true", P4, _nothing, "RP003"),
    ("chunking-off-short-prompts", P4, _opt("hybrid_opt_chunk_context", "0"), "RP004"),  # 4096-token prompts fit one 4096 pass
    ("multiple-and-within", P16, _search(max_length=8192), "RP005"),
    ("sdk-1.6", P4, _nothing, "RP006"),
    ("sampling-amd", P16, _nothing, "RP007"),
    ("small-drift", HYBRID, _search(top_p=0.85, temperature=0.7), "RP007"),
    ("prompt-on-tier", P16, _rai("1.8.0", 3072), "RP008"),
    ("prompt-far-above-tier", P16, _rai("1.8.0", 2900), "RP008"),  # 2900 → 3072 pads little
]


@pytest.mark.parametrize("case", TRIGGERS, ids=[c[0] for c in TRIGGERS])
def test_advice_fires(make_pkg, monkeypatch, case):
    case_id, profile_id, mutate, check_id, words = case
    pkg = make_pkg(profile_id)
    mutate(pkg)
    if case_id == "sdk-prompt":
        monkeypatch.setenv("RAIPACK_SDK_VERSION", "1.5.1")
    result = validate(pkg, profile_id)
    found = [f for f in advice(result) if f.check_id == check_id]
    assert found, f"{check_id} did not fire: {[(f.check_id, f.message) for f in result.findings]}"
    message = " ".join(f.message for f in found)
    for word in words:
        assert word in message
    assert all(f.hint for f in found)


@pytest.mark.parametrize("case_id,profile_id,mutate,check_id", QUIET, ids=[c[0] for c in QUIET])
def test_advice_quiet(make_pkg, case_id, profile_id, mutate, check_id):
    pkg = make_pkg(profile_id)
    mutate(pkg)
    result = validate(pkg, profile_id)
    assert check_id in result.checks_run
    assert [f.message for f in advice(result) if f.check_id == check_id] == []


def test_every_advice_check_has_a_trigger_and_a_quiet_case():
    ids = {c for c, s in load_all().items() if s.severity == "advice"}
    assert ids == {c[3] for c in TRIGGERS} == {c[3] for c in QUIET}
    assert ids == {f"RP00{i}" for i in range(1, 9)}


@pytest.mark.parametrize("profile_id", sorted(all_profiles()))
def test_generated_packages_get_no_advice(make_pkg, profile_id):
    """The factory follows AMD's settings, so a fresh package gets no advice."""
    assert advice(validate(make_pkg(profile_id))) == []


def test_installed_version_from_the_installer_path(make_pkg, monkeypatch):
    pkg = make_pkg(P4)
    monkeypatch.delenv("RAIPACK_SDK_VERSION", raising=False)
    monkeypatch.setenv("RYZEN_AI_INSTALLATION_PATH", r"C:\Program Files\RyzenAI\1.4.0")
    found = [f for f in advice(validate(pkg)) if f.check_id == "RP006"]
    assert len(found) == 1 and "Ryzen AI 1.4.0 (installed" in found[0].message
    assert "1.6.0 or later" in found[0].hint


def test_advice_fails_only_with_strict_advice(make_pkg, capsys):
    pkg = make_pkg(P16)
    _search(num_beams=2)(pkg)
    for argv, code in ((["validate", str(pkg)], 0), (["validate", "--strict-advice", str(pkg)], 1)):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == code
    assert "RP007" in capsys.readouterr().out


def test_inspect_shows_advice_and_the_tier_table(make_pkg, capsys):
    pkg = make_pkg(P16)
    _rai("1.8.0", 2100)(pkg)
    with pytest.raises(SystemExit) as exc:
        main(["inspect", "--json", str(pkg)])
    assert exc.value.code == 0
    data = json.loads(capsys.readouterr().out)
    assert {a["check_id"] for a in data["advice"]} == {"RP006", "RP008"}  # 2100 is also below the 4096-token chunk
    row = next(r for r in data["tiers"] if r["setting"] == "max_prompt_length[1.8.0]")
    assert (row["tier_below"], row["tier"], row["padding"]) == (2048, 3072, 972)
    with pytest.raises(SystemExit):
        main(["inspect", str(pkg)])
    out = capsys.readouterr().out
    assert "advice" in out and "RP008" in out and "tier below" in out and "972" in out
