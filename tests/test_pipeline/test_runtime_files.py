"""`raipack validate` on AMD-layout folders (no raipack manifest) missing the files their runtime loads
(issue 24, high item 4): each break the red-team made, on a clean 1.8.0 NPU package of AMD's layout."""

from __future__ import annotations

import os
import shutil

import pytest

from factory import make_package
from raipack.validate import validate

PROFILE = "1.8.0-npu-16K"


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    pkg = make_package(tmp_path_factory.mktemp("amd"), PROFILE)
    assert not (pkg / "manifest.json").exists()  # AMD's own layout: nothing records the files' digests
    result = validate(pkg)
    assert result.profile == PROFILE and [f for f in result.findings if f.severity in ("error", "warning")] == []
    return pkg


def _folder(path):
    path.unlink()
    path.mkdir()


BREAKS = {
    "model.bin cut in half": (lambda p: os.truncate(p / "model.bin", os.path.getsize(p / "model.bin") // 2), "RP112", "model.bin", "error"),
    "model.pb.bin cut in half": (lambda p: os.truncate(p / "model.pb.bin", os.path.getsize(p / "model.pb.bin") // 2), "RP112", "model.pb.bin", "error"),
    "tokenizer_config.json is a folder": (lambda p: _folder(p / "tokenizer_config.json"), "RP111", "tokenizer_config.json", "error"),
    "model.bin is a folder": (lambda p: _folder(p / "model.bin"), "RP111", "model.bin", "error"),
    "cache/txn_bins.zip deleted": (lambda p: (p / "cache" / "txn_bins.zip").unlink(), "RP111", "cache/txn_bins.zip", "error"),
    "cache/<node>_meta.json deleted": (lambda p: (p / "cache" / "MatMulNBits_0_0_meta.json").unlink(), "RP111", "cache/MatMulNBits_0_0_meta.json", "error"),
    "a dd_metastate file replaced by a folder": (lambda p: _folder(p / "dd_metastate_Llm_Token_MatMulNBits_0_0.state"), "RP111", "dd_metastate_Llm_Token_MatMulNBits_0_0.state", "error"),
    "a .const a meta file names cut short": (lambda p: os.truncate(p / "cache" / "MatMulNBits_1_0_wts.const", 100), "RP603", "cache/MatMulNBits_1_0_wts.const", "error"),
    "a .const a meta file names deleted": (lambda p: (p / "cache" / "MatMulNBits_1_0_wts.const").unlink(), "RP603", "cache/MatMulNBits_1_0_meta.json", "error"),
    # the runtime compiles a missing state at first load (AMD package facts §6 [V]): slow, not broken
    "a dd_metastate .state deleted": (lambda p: (p / "dd_metastate_Llm_Token_MatMulNBits_0_0.state").unlink(), "RP111", "dd_metastate_Llm_Token_MatMulNBits_0_0.state", "warning"),
}


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_a_runtime_file_missing_a_folder_or_short_is_found(clean, tmp_path, name):
    mutate, check_id, path, severity = BREAKS[name]
    pkg = tmp_path / clean.name
    shutil.copytree(clean, pkg)
    mutate(pkg)
    found = [(f.check_id, f.path, f.severity) for f in validate(pkg).findings if f.severity in ("error", "warning")]
    assert (check_id, path, severity) in found, found


def test_a_metastate_set_missing_a_member_its_release_ships_together_is_an_error(tmp_path):
    """1.6 NPU: .state, .super, .ctrlpkt present and .fconst gone: the token-phase weight stream, without
    which the package cannot decode (AMD package facts §6 [V3]); it was a warning."""
    pkg = make_package(tmp_path, "1.6-npu")
    sets = sorted(pkg.glob("dd_metastate_*.fconst"))
    assert sets, "the 1.6 NPU fixture (tests/factory.py) writes no .fconst files: the fixture regressed, or the profile's siblings changed"
    sets[0].unlink()
    found = [(f.check_id, f.severity) for f in validate(pkg).findings if f.path == sets[0].name]
    assert ("RP601", "error") in found, found
