"""RP112 (issue 24, item 4's length rule): AMD's NPU weights header (`model.pb.bin`, `prefill.pb.bin`,
`model_jit.pb.bin`) parses as the protobuf Header AMD's runtime reads, and the weights file it names is
long enough for every weight it places there. The headers here are written by protobuf itself from the
field table (tests/amd_header.py), as AMD's jit.py lays them out; raipack's reader is held to protobuf's
parser on mutated and random bytes."""

from __future__ import annotations

import os
import random
import shutil

import pytest
from google.protobuf.message import DecodeError

from amd_header import header_bytes, header_class
from factory import lfs_pointer_text, make_package, reference_package
from helpers import run_cli
from raipack.npu import amd_header
from raipack.validate import validate

# (profile, header, weights): the three AMD layouts that carry an NPU weights header
LAYOUTS = {"1.8.0-npu-16K": ("model.pb.bin", "model.bin"), "1.6-npu": ("prefill.pb.bin", "prefill.bin"),
           "1.7.1-hybrid": ("model_jit.pb.bin", "model_jit.bin")}


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    out = {}
    for profile in LAYOUTS:
        pkg = make_package(tmp_path_factory.mktemp(profile), profile)
        result = validate(pkg)
        assert result.profile == profile and [f for f in result.findings if f.severity in ("error", "warning")] == []
        out[profile] = pkg
    return out


def copy(clean, tmp_path, profile):
    pkg = tmp_path / clean[profile].name
    shutil.copytree(clean[profile], pkg)
    return pkg


def rp112(pkg):
    return [(f.path, f.severity, f.message) for f in validate(pkg).findings if f.check_id == "RP112"]


@pytest.mark.parametrize("profile", sorted(LAYOUTS))
def test_a_weights_file_cut_in_half_is_an_error(clean, tmp_path, profile):
    header, weights = LAYOUTS[profile]
    pkg = copy(clean, tmp_path, profile)
    size = os.path.getsize(pkg / weights)
    os.truncate(pkg / weights, size // 2)
    (found,) = rp112(pkg)
    assert found[:2] == (weights, "error")
    assert f"is {size // 2} bytes" in found[2] and header in found[2] and f"at bytes 0 to {size}" in found[2] and "reads past the end" in found[2]


def test_the_length_rule_is_exact_at_the_end_of_the_file(clean, tmp_path):
    """One byte short is an error; the exact size and one byte more are not (padding after the last weight is harmless)."""
    pkg = copy(clean, tmp_path, "1.8.0-npu-16K")
    size = os.path.getsize(pkg / "model.bin")
    os.truncate(pkg / "model.bin", size - 1)
    assert [f[:2] for f in rp112(pkg)] == [("model.bin", "error")]
    os.truncate(pkg / "model.bin", size + 1)
    assert rp112(pkg) == []


def test_the_furthest_of_several_weights_is_named(clean, tmp_path):
    pkg = copy(clean, tmp_path, "1.8.0-npu-16K")
    tensors = [("layers.0.mlp", 0, 1000), ("layers.1.mlp", 1000, 3000), ("lm_head", 4000, 96)]
    (pkg / "model.pb.bin").write_bytes(header_bytes("model.bin", tensors))
    os.truncate(pkg / "model.bin", 2000)
    (found,) = rp112(pkg)
    assert "places 2 of its 3 weights beyond that" in found[2] and "node lm_head, tensor 0) at bytes 4000 to 4096" in found[2]


@pytest.mark.parametrize("name, mutate", [
    ("cut in half", lambda p: os.truncate(p, os.path.getsize(p) // 2)),
    ("zeros", lambda p: p.write_bytes(bytes(os.path.getsize(p)))),
    ("raipack's own header magic", lambda p: p.write_bytes(b"RAIPKNPU" + bytes(248))),
])
def test_a_header_that_does_not_parse_is_an_error(clean, tmp_path, name, mutate):
    pkg = copy(clean, tmp_path, "1.8.0-npu-16K")
    mutate(pkg / "model.pb.bin")
    with pytest.raises(DecodeError):  # protobuf refuses it too: the runtime's ParseFromIstream would
        header_class()().ParseFromString((pkg / "model.pb.bin").read_bytes())
    (found,) = rp112(pkg)
    assert found[:2] == ("model.pb.bin", "error")
    assert "does not parse as AMD's NPU weights header" in found[2] and "at byte" in found[2] and "Cannot read header from model.pb.bin" in found[2]


def test_the_issue_reproduction_fails_validate(clean, tmp_path, capsys):
    """Issue 24, item 4: `model.pb.bin` or `model.bin` cut in half passed with exit 0 and no finding."""
    for rel in ("model.pb.bin", "model.bin"):
        pkg = copy(clean, tmp_path / rel, "1.8.0-npu-16K")
        os.truncate(pkg / rel, os.path.getsize(pkg / rel) // 2)
        ran = run_cli(capsys, "validate", str(pkg))
        assert ran.code == 1 and "RP112" in ran.out and rel in ran.out, ran.out


def test_a_header_naming_a_missing_or_outside_weights_file_is_an_error(clean, tmp_path):
    pkg = copy(clean, tmp_path, "1.8.0-npu-16K")
    (pkg / "model.pb.bin").write_bytes(header_bytes("weights_v2.bin", [("n", 0, 16)]))
    assert [f[:2] for f in rp112(pkg)] == [("model.pb.bin", "error")]
    assert "names weights file weights_v2.bin, which is not in the package" in rp112(pkg)[0][2]
    (pkg / "model.pb.bin").write_bytes(header_bytes("../model.bin", [("n", 0, 16)]))
    assert "a path that leaves the package" in rp112(pkg)[0][2]


def test_a_header_with_another_weights_name_is_held_to_that_file(clean, tmp_path):
    """The runtime reads parent(external_data_file)/external_data.filename, not the sibling by name."""
    pkg = copy(clean, tmp_path, "1.8.0-npu-16K")
    (pkg / "other.bin").write_bytes(bytes(10))
    (pkg / "model.pb.bin").write_bytes(header_bytes("other.bin", [("n", 0, 16)]))
    (found,) = rp112(pkg)
    assert found[0] == "other.bin" and "is 10 bytes" in found[2]


def test_a_header_without_jit_weights_asks_for_no_weights_file(clean, tmp_path):
    """jit.py writes filename '' when no weight is offloaded: the runtime then reads no weights file."""
    pkg = copy(clean, tmp_path, "1.8.0-npu-16K")
    (pkg / "model.pb.bin").write_bytes(header_bytes("", [("n", 0, 1 << 20)]))
    os.truncate(pkg / "model.bin", 1)
    assert rp112(pkg) == []


def test_an_empty_header_parses_as_protobuf_parses_it(clean, tmp_path):
    """Zero bytes are an empty Header to protobuf (no weights file, no tensors): not RP112's to refuse;
    RP103 reports the empty file."""
    header_class()().ParseFromString(b"")
    pkg = copy(clean, tmp_path, "1.8.0-npu-16K")
    (pkg / "model.pb.bin").write_bytes(b"")
    assert rp112(pkg) == []
    assert ("RP103", "error") in {(f.check_id, f.severity) for f in validate(pkg).findings if f.path == "model.pb.bin"}  # an empty file is RP103's


def test_the_size_a_git_lfs_pointer_records_stands_for_the_weights_file(clean, tmp_path):
    pkg = copy(clean, tmp_path, "1.8.0-npu-16K")
    size = os.path.getsize(pkg / "model.bin")
    (pkg / "model.bin").write_text(lfs_pointer_text(size))
    assert rp112(pkg) == []
    (pkg / "model.bin").write_text(lfs_pointer_text(size - 1))
    (found,) = rp112(pkg)
    assert found[0] == "model.bin" and "(its Git LFS pointer's size)" in found[2]


def test_a_header_that_is_a_git_lfs_pointer_is_left_to_the_pointer_rule(clean, tmp_path):
    pkg = copy(clean, tmp_path, "1.8.0-npu-16K")
    (pkg / "model.pb.bin").write_text(lfs_pointer_text(7129))
    ids = {f.check_id for f in validate(pkg).findings if f.path == "model.pb.bin" and f.severity == "error"}
    assert "RP112" not in ids and ids, ids


def test_a_package_raipack_built_is_left_to_rp901():
    """raipack's own header (RAIPKNPU) is not AMD's protobuf: RP112 says nothing there."""
    pkg = reference_package("reference-16K")
    assert (pkg / "model.pb.bin").read_bytes().startswith(b"RAIPKNPU") and rp112(pkg) == []


def test_the_reader_reads_what_protobuf_wrote():
    raw = header_bytes("model.bin", [("layers.0.mlp", 0, 4096), ("lm_head", 4096, 1 << 33)], size=7129)
    header = amd_header.decode(raw)
    assert len(raw) == 7129 and header["external_data"] == {"filename": "model.bin", "npu": True}
    assert sorted(amd_header.weights_extents(header)) == [("layers.0.mlp", 0, 0, 4096), ("lm_head", 0, 4096, 1 << 33)]
    assert max(e.end for e in amd_header.weights_extents(header)) == 4096 + (1 << 33)


def _mutations(base: bytes, rng: random.Random, n: int):
    for _ in range(n):
        b = bytearray(base)
        kind = rng.randrange(4)
        if kind == 0:  # a few bytes changed
            for _ in range(rng.randrange(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif kind == 1:  # cut short
            b = b[:rng.randrange(len(b))]
        elif kind == 2:  # bytes inserted
            p = rng.randrange(len(b))
            b[p:p] = rng.randbytes(rng.randrange(1, 6))
        else:  # noise
            b = bytearray(rng.randbytes(rng.randrange(1, 40)))
        yield bytes(b)


def test_the_reader_accepts_and_refuses_what_protobuf_does():
    """4 000 seeded mutations of a header and random byte strings: raipack's reader refuses exactly the
    ones protobuf's parser refuses, and where both accept, they place the same weights in the same file."""
    base = header_bytes("model.bin", [("layers.0.mlp", 0, 4096), ("layers.1.mlp", 4096, 8192), ("lm_head", 12288, 1 << 33)])
    refused = 0
    for raw in _mutations(base, random.Random(24), 4000):
        try:
            ours = amd_header.decode(raw)
        except amd_header.HeaderError:
            ours = None
        theirs = header_class()()
        try:
            theirs.ParseFromString(raw)
        except DecodeError:
            theirs = None
        assert (ours is None) == (theirs is None), raw.hex()
        if ours is None:
            refused += 1
            continue
        try:
            want = sorted((n, i, t.offset, t.size) for n, op in theirs.operators.items() for i, t in enumerate(op.data))
            name = theirs.external_data.filename
            name = name.decode("utf-8", "replace") if isinstance(name, bytes) else name  # not UTF-8: upb hands back bytes
        except UnicodeDecodeError:  # a mutated name that is not UTF-8 (raipack reads it with replacement characters)
            continue
        assert sorted(amd_header.weights_extents(ours)) == want, raw.hex()
        assert ours.get("external_data", {}).get("filename", "") == name, raw.hex()
    assert refused > 500 and 4000 - refused > 300  # both kinds were exercised (3 511 refused with this seed)


def test_a_header_too_large_to_read_is_a_warning_not_a_verdict(clean, tmp_path):
    """raipack reads at most 16 MiB of a header (AMD's are a few KiB); past that it says it did not check."""
    from raipack.checks.runtime import HEADER_MAX_BYTES

    pkg = copy(clean, tmp_path, "1.8.0-npu-16K")
    os.truncate(pkg / "model.pb.bin", HEADER_MAX_BYTES + 1)
    (found,) = rp112(pkg)
    assert found[:2] == ("model.pb.bin", "warning") and "its weights were not checked" in found[2]
