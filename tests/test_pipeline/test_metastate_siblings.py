"""A dd_metastate set missing a sibling its release ships with it, or one every other set has, is an
incomplete copy (issue 13): RP601 names the set and the missing file, a warning, or an error where the
profile requires the file. Complete sets, raipack's .plan/.state sets and LFS pointers stay quiet."""

from __future__ import annotations

import pytest

from factory import Dims, lfs_pointer_text
from raipack.core import schemas
from raipack.npu.profile import all_profiles
from raipack.validate import validate

P16, P16_OLD = "1.8.0-npu-16K", "1.6-npu"
LAYOUT = "dd_metastate_Llm_Token_MatMulNBits_1_0"  # a set the factory writes for every non-tiered profile


def sets_of(pkg) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in pkg.glob("dd_metastate_*"):
        stem, ext = path.name.rsplit(".", 1)
        out.setdefault(stem, set()).add(ext)
    return out


def give(pkg, stem: str, *exts: str) -> None:
    for ext in exts:
        (pkg / f"{stem}.{ext}").write_bytes(b"\x01" * 64)


def rp601(pkg, profile_id: str):
    result = validate(pkg, profile_id)
    return result, [f for f in result.findings if f.check_id == "RP601"]


def with_groups(pkg, profile_id: str) -> list[list[str]]:
    """Every set gets all files of its profile's ship-together groups; returns the groups."""
    groups = all_profiles()[profile_id].metastate.ship_together
    for stem in sets_of(pkg):
        give(pkg, stem, *(e for g in groups for e in g))
    return groups


GROUPED = sorted(pid for pid, p in all_profiles().items() if p.metastate.ship_together and not p.metastate.tiered)


def test_some_profiles_declare_what_ships_together():
    assert P16 in GROUPED and P16_OLD in GROUPED


@pytest.mark.parametrize("profile_id", GROUPED)
def test_complete_sets_have_no_finding(make_pkg, profile_id):
    pkg = make_pkg(profile_id)
    groups = with_groups(pkg, profile_id)
    assert all(set(g) <= exts for g in groups for exts in sets_of(pkg).values())
    result, found = rp601(pkg, profile_id)
    assert found == [] and not result.failed(strict=True)


@pytest.mark.parametrize("profile_id", GROUPED)
def test_a_set_missing_a_file_its_layout_ships_with_the_others(make_pkg, profile_id):
    """`.state`, `.super` and `.ctrlpkt` present, `.fconst` missing (the first member of each group),
    while no other set has the group either: only the layout says the file belongs there."""
    pkg = make_pkg(profile_id)
    spec = all_profiles()[profile_id].metastate
    group = spec.ship_together[0]
    for stem in sets_of(pkg):
        for ext in set(group) - set(spec.siblings):
            (pkg / f"{stem}.{ext}").unlink(missing_ok=True)
    give(pkg, LAYOUT, *group[1:])
    (pkg / f"{LAYOUT}.{group[0]}").unlink(missing_ok=True)
    result, found = rp601(pkg, profile_id)
    assert [f.path for f in found] == [f"{LAYOUT}.{group[0]}"], [(f.path, f.message) for f in found]
    f = found[0]
    assert f.severity == "error"  # issue 24: the runtime cannot run the node without it
    assert LAYOUT in f.message and f.hint
    if group[0] not in spec.siblings:
        assert f"ships .{group[0]}, " in f.message and "which has " in f.message and "cannot run the node" in f.message
        assert "copied incompletely" in f.hint and f"{LAYOUT}.{group[0]}" in f.hint
        assert result.failed()
    else:
        assert f"requires .{group[0]}" in f.message and result.failed()


def test_fconst_missing_beside_state_super_and_ctrlpkt_is_an_error_for_1_8(make_pkg):
    """Issue 24: the token-phase weight stream; without it the package cannot decode (it was a warning)."""
    pkg = make_pkg(P16)
    give(pkg, LAYOUT, "super", "ctrlpkt")
    _, found = rp601(pkg, P16)
    assert [(f.severity, f.path) for f in found] == [("error", f"{LAYOUT}.fconst")]
    assert found[0].message == (f"is missing from the metastate set {LAYOUT}, which has .ctrlpkt, .state and .super: "
                                f"profile {P16}'s layout ships .fconst, .super and .ctrlpkt together, and the runtime cannot run the node without it")


def test_fconst_missing_where_the_profile_requires_it_is_one_error(make_pkg):
    pkg = make_pkg(P16_OLD)
    (pkg / f"{LAYOUT}.fconst").unlink()
    result, found = rp601(pkg, P16_OLD)
    assert [(f.severity, f.path) for f in found] == [("error", f"{LAYOUT}.fconst")]  # no second, weaker finding for the same file
    assert result.failed()


@pytest.mark.parametrize("layers", [1, 2])
def test_a_set_missing_a_file_every_other_set_has(make_pkg, layers):
    """`.input` ships with no group, so only the package's other sets say it belongs; with one layer
    there are two sets, too few for a majority but the other one has it."""
    pkg = make_pkg(P16, d=Dims(layers=layers))
    stems = sorted(sets_of(pkg))
    give(pkg, stems[0], *(e for g in with_groups(pkg, P16) for e in g))
    for stem in stems[1:]:
        give(pkg, stem, "input")
    _, found = rp601(pkg, P16)
    assert [(f.severity, f.path) for f in found] == [("warning", f"{stems[0]}.input")]
    assert found[0].message == f"is missing from the metastate set {stems[0]} while the other {len(stems) - 1} sets of the package all have a .input file"
    assert "copy" in found[0].hint


def test_a_file_most_sets_have(make_pkg):
    pkg = make_pkg(P16, d=Dims(layers=3))
    stems = sorted(sets_of(pkg))
    assert len(stems) == 6
    for stem in stems[2:]:
        give(pkg, stem, "input")
    _, found = rp601(pkg, P16)
    assert sorted(f.path for f in found) == [f"{s}.input" for s in stems[:2]]
    assert all(f.severity == "warning" and "4 of 6 sets" in f.message for f in found)


def test_a_file_few_sets_have_is_not_reported(make_pkg):
    pkg = make_pkg(P16, d=Dims(layers=2))
    give(pkg, sorted(sets_of(pkg))[0], "input")
    assert rp601(pkg, P16)[1] == []


def test_an_lfs_pointer_is_present_not_missing(make_pkg):
    pkg = make_pkg(P16)
    with_groups(pkg, P16)
    (pkg / f"{LAYOUT}.fconst").write_text(lfs_pointer_text(2 << 30))
    result, found = rp601(pkg, P16)
    assert found == []
    assert [f.path for f in result.findings if f.check_id == "RP102"] == [f"{LAYOUT}.fconst"]


def test_an_orphan_is_reported_once_not_as_a_missing_sibling(make_pkg):
    pkg = make_pkg(P16)
    with_groups(pkg, P16)
    (pkg / f"{LAYOUT}.state").unlink()
    _, found = rp601(pkg, P16)
    assert {f.path for f in found} == {f"{LAYOUT}.{e}" for e in ("fconst", "super", "ctrlpkt")}
    assert all(f.severity == "error" and "orphaned" in f.message for f in found)


def test_the_profile_schema_takes_groups_of_suffixes():
    base = {"required": True, "siblings": ["state"], "optional_siblings": [], "tiered": False}
    good = dict(schemas.errors("profile", {"metastate": {**base, "ship_together": [["fconst", "super"]]}}))
    bad = dict(schemas.errors("profile", {"metastate": {**base, "ship_together": ["fconst"]}}))
    assert not any(k.startswith("/metastate") for k in good), good
    assert "/metastate/ship_together/0" in bad, bad
