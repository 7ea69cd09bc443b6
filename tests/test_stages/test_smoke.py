"""The smoke stage's NPU attempt and the fuse stage's ryzenai-sdk backend, with real errors and fakes."""

from __future__ import annotations

import os
import stat
import sys
import types

import pytest

from pipeline.errors import RaipackError
from pipeline.validate import validate
from stages.fuse import sdk
from stages.fuse.stage import choose_backend
from stages.smoke.npu import try_npu
from stages.smoke.stage import _problems

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_real_onnxruntime_genai_error_is_reported_in_one_line(make_pkg, monkeypatch):
    """On this machine there is no RyzenAI provider library: OGA's own error comes back, no fallback claim."""
    monkeypatch.delenv("RYZENAI_EP_PATH", raising=False)
    attempt = try_npu(make_pkg("1.8.0-npu-16K"), [[1, 2, 3]], 4)
    assert attempt.ok is False
    assert "\n" not in attempt.reason and len(attempt.reason) <= 400
    assert "RYZENAI_EP_PATH is not set" in attempt.reason
    assert attempt.tokens == []


def fake_og(tokens):
    """A stand-in onnxruntime_genai whose Model loads and whose generator yields `tokens`."""
    mod = types.ModuleType("onnxruntime_genai")

    class Model:
        def __init__(self, path):
            self.path = path

    class GeneratorParams:
        def __init__(self, model):
            self.options = {}

        def set_search_options(self, **kw):
            self.options.update(kw)

    class Generator:
        def __init__(self, model, params):
            self.left = list(tokens)
            self.last = None

        def append_tokens(self, ids):
            self.prompt = list(ids)

        def is_done(self):
            return not self.left

        def generate_next_token(self):
            self.last = self.left.pop(0)

        def get_next_tokens(self):
            return [self.last]

    mod.Model, mod.GeneratorParams, mod.Generator = Model, GeneratorParams, Generator
    return mod


def test_npu_path_wiring_with_a_fake_runtime(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", fake_og([5, 6, 7]))
    attempt = try_npu(tmp_path, [[1, 2], [3]], 2)
    assert attempt.ok and attempt.tokens == [[5, 6], [5, 6]]
    assert "RyzenAI" in attempt.reason


def test_smoke_problems_name_what_failed():
    good = {"finite": True, "tokens_match_export": True, "tiers": [{"tier": 128, "finite": True, "tokens_match_export": True}], "overlong_prompt_refused": True, "answer": "The capital of France is Paris."}
    assert _problems(good, "Paris") == []
    bad = dict(good, finite=False, tokens_match_export=False, overlong_prompt_refused=False, answer="Lyon")
    probs = _problems(bad, "Paris")
    assert len(probs) == 4 and any("NaN" in p for p in probs) and any("'Paris'" in p for p in probs)


FAKE_TOOL = """#!{python}
import sys
sys.path.append({tests!r})
from pathlib import Path
from factory import make_package
args = sys.argv[1:]
if {fail!r}:
    print("model_generate: unsupported operator pattern in layer 3", file=sys.stderr)
    sys.exit(4)
out, src = Path(args[1]), Path(args[2])
tmp = out.parent / (".fake-" + out.name)
pkg = make_package(tmp, "1.8.0-npu-16K", name="p")
for item in pkg.iterdir():
    item.rename(out / item.name)
(out / "args.txt").write_text(" ".join(args))
"""


def fake_tool(tmp_path, fail=False):
    path = tmp_path / "model_generate"
    path.write_text(FAKE_TOOL.format(python=sys.executable, tests=TESTS, fail=fail))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_auto_backend_says_which_ran_and_why(tmp_path, monkeypatch):
    monkeypatch.delenv("RAIPACK_MODEL_GENERATE", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    backend, why = choose_backend("auto")
    assert backend == "reference" and "not installed" in why
    monkeypatch.setenv("RAIPACK_MODEL_GENERATE", str(fake_tool(tmp_path)))
    backend, why = choose_backend("auto")
    assert backend == "ryzenai-sdk" and str(tmp_path) in why


def test_sdk_backend_contract_with_a_fake_model_generate(tmp_path, monkeypatch):
    from pipeline.profile import get

    monkeypatch.setenv("RAIPACK_MODEL_GENERATE", str(fake_tool(tmp_path)))
    out = tmp_path / "out"
    out.mkdir()
    report = sdk.generate(get("1.8.0-npu-16K"), tmp_path / "export", out)
    assert report["backend"] == "ryzenai-sdk"
    assert (out / "args.txt").read_text().split()[:1] == ["--npu"]
    assert "--token_fusion" in report["command"] and "max_seq_len=16384" in report["command"]
    (out / "args.txt").unlink()
    result = validate(out, "1.8.0-npu-16K")
    assert not result.failed(), [f.message for f in result.findings]


def test_sdk_backend_failure_is_one_sentence(tmp_path, monkeypatch):
    from pipeline.profile import get

    monkeypatch.setenv("RAIPACK_MODEL_GENERATE", str(fake_tool(tmp_path, fail=True)))
    with pytest.raises(RaipackError, match="model_generate failed: model_generate: unsupported operator pattern in layer 3"):
        sdk.generate(get("1.8.0-npu-4K"), tmp_path, tmp_path / "o")
    monkeypatch.setenv("RAIPACK_MODEL_GENERATE", str(tmp_path / "missing"))
    with pytest.raises(RaipackError, match="not installed"):
        sdk.generate(get("1.8.0-npu-4K"), tmp_path, tmp_path / "o")
