"""raipack's genai_config verdict against the real onnxruntime-genai loaders (issue 36).

For each loader version the Ryzen AI releases ship (0.9.2 for 1.6, 0.11.2 for 1.7, 0.14.0 for 1.8) and
the test venv's own, the wheel is installed in a side folder (tests/oga_loaders.py) and asked for
`og.Config(folder)` on every seeded mutation (tests/loader_mutations.py) of AMD's real configs
(tests/data/real) and of raipack's own reference builds. raipack judges the same bytes with the grammar
generated for that version (upstream, without AMD's additions: the wheels are upstream builds). Held:
no case the loader refuses and raipack passes; no traceback from `raipack validate` on any case; every
case raipack refuses and the loader takes is one of the kinds docs/validating.md lists as stricter.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from loader_mutations import mutations
from oga_loaders import RELEASE_LOADERS, current, verdicts
from raipack.npu.loader_config import grammar_for, judge
from raipack.validate import validate
from real_corpus import REAL, packages

N = 1200  # mutations, each judged by every loader
STRICTER = ("not JSON as the loader reads it", "(this loader casts it without a check")  # docs/validating.md, "Stricter than the loader"

pytestmark = pytest.mark.fuzz


AMD_ONLY = ("config_entries", "custom_allocator", "external_data_file")  # pipeline/data/oga/amd_runtime.json


def _bases(reference_packages) -> list:
    docs = [json.loads((REAL / name / "files" / "genai_config.json").read_bytes()) for name in packages()]
    for doc in list(docs):  # AMD's 1.6 config as an upstream loader takes it too, so most cases are not refused for AMD's keys alone
        session = doc["model"]["decoder"]["session_options"]
        if any(k in session for k in AMD_ONLY):
            docs.append(json.loads(json.dumps(doc)))
            for k in AMD_ONLY:
                docs[-1]["model"]["decoder"]["session_options"].pop(k, None)
    for pid in ("reference-16K", "reference-4K", "reference-1.8.0-hybrid", "reference-1.7.1-16K"):
        docs.append(json.loads((Path(reference_packages[pid]) / "genai_config.json").read_bytes()))
    return docs


@pytest.fixture(scope="module")
def cases(reference_packages, tmp_path_factory) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("loader-mutations")
    out = {}
    for i, (kind, raw) in enumerate(mutations(_bases(reference_packages), N)):
        folder = root / f"{i:04d}-{kind}"
        folder.mkdir()
        (folder / "genai_config.json").write_bytes(raw)
        out[str(folder)] = raw
    return out


@pytest.mark.parametrize("version", [*RELEASE_LOADERS, "current"])
def test_no_config_the_loader_refuses_passes_raipack(version, cases):
    wanted = current() if version == "current" else version
    start = time.perf_counter()
    reported, loader = verdicts(wanted, sorted(cases))
    loader_seconds = time.perf_counter() - start
    assert reported == wanted, f"the side folder holds onnxruntime-genai {reported}, not {wanted}"
    grammar_version, _how = grammar_for(wanted)
    missed, stricter, refused = [], [], 0
    for folder, raw in cases.items():
        ours = judge(raw, grammar_version)
        if loader[folder] is not None:
            refused += 1
            if not ours:
                missed.append(f"{Path(folder).name}: loader says {loader[folder]!r}")
        elif ours:
            stricter.append((Path(folder).name, ours[0].message))
    print(f"onnxruntime-genai {wanted} (grammar {grammar_version}): {len(cases)} cases, loader refused {refused}, "
          f"raipack stricter on {len(stricter)}, loader {loader_seconds:.1f} s")
    assert len(cases) // 4 < refused < len(cases) * 9 // 10, f"the loader refused {refused} of {len(cases)}: the harness tests too little"
    print("stricter:", sorted({m.split(" (")[0][:70] for _n, m in stricter})[:12])
    assert not missed, f"{len(missed)} configs onnxruntime-genai {wanted} refuses pass raipack:\n" + "\n".join(missed[:20])
    unexplained = [s for s in stricter if not any(k in s[1] for k in STRICTER)]
    assert not unexplained, "raipack refuses what the loader takes, of a kind docs/validating.md does not list:\n" + "\n".join(map(str, unexplained[:20]))


def test_validate_never_crashes_on_a_mutated_config(cases):
    """Every case through `raipack validate` in-process: a traceback fails the test, naming its case."""
    slow = []
    for folder in cases:
        start = time.perf_counter()
        result = validate(Path(folder))  # a traceback fails the test with its case
        seconds = time.perf_counter() - start
        assert result.checks_run, folder
        if seconds > 5:
            slow.append((folder, seconds))
    assert not slow, f"cases over 5 s: {slow}"
