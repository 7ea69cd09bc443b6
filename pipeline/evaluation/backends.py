"""The runtime each kind of target runs on, behind one small interface.

`rows(context, continuation)` returns the logits [len(continuation), vocab] that predict each
continuation token (what loglikelihood needs: every continuation position, not only the last);
`generate(ids, max_new_tokens)` greedy new token ids, stopping at an EOS id.

- source, quark: transformers (`trust_remote_code=False`); a Quark folder is reloaded through
  transformers' own Quark support (amd-quark installed).
- export: `pipeline/runtime/ortloop.py: OrtDecoder`, the plain onnxruntime loop over the builder's
  graph. Not onnxruntime-genai: its generator hands back the last position's logits per step, while
  OrtDecoder's prefill returns every position's row in one call; on CPU both give the same tokens
  (the smoke stage compares against OrtDecoder).
- package: the NPU through onnxruntime-genai when it can run the package here (pipeline/runtime/readiness.py,
  the answer smoke, bench and doctor get), which this backend does not drive yet; so the reference runtime
  (`pipeline/runtime/reference.py`) on the CPU, and `ran_on` says why. Its fused graph returns the
  last position's row only: the context is one prefill (padded to its tier, as on the NPU) and every
  further continuation row comes from one token step, as the NPU runtime decodes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raipack.core.errors import RaipackError
from raipack.runtime.numerics import HONEST
from raipack.runtime.ortloop import OrtDecoder
from raipack.runtime.readiness import npu_readiness
from raipack.runtime.reference import ReferenceRuntime, RuntimeRefusal
from raipack.runtime.trust import PackageError


class TorchBackend:
    """A source or Quark folder through transformers, on the CPU."""

    def __init__(self, folder: Path, kind: str):
        import torch
        from transformers import AutoModelForCausalLM

        self._torch = torch
        try:
            self.model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False, dtype=torch.float32).eval()
        except Exception as exc:  # transformers raises many kinds for a folder it cannot load
            raise RaipackError(f"transformers cannot load {folder} as a {kind} model: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                               "check the folder with raipack validate; a Quark folder needs amd-quark installed") from None
        cfg = self.model.config
        self.max_length = int(getattr(cfg, "max_position_embeddings", 2048) or 2048)
        eos = getattr(self.model.generation_config, "eos_token_id", None) or getattr(cfg, "eos_token_id", None)
        self.eos_token_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.ran_on = "cpu (transformers" + (", Quark's quantized modules)" if kind == "quark" else ")")

    def _logits(self, ids: list[int]) -> np.ndarray:
        with self._torch.no_grad():
            out = self.model(input_ids=self._torch.tensor([ids], dtype=self._torch.long))
        return out.logits[0].float().numpy()

    def rows(self, context: list[int], continuation: list[int]) -> np.ndarray:
        full = self._logits(context + continuation)
        return full[len(context) - 1: len(context) + len(continuation) - 1]

    def generate(self, ids: list[int], max_new_tokens: int) -> list[int]:
        out: list[int] = []
        seq = list(ids)
        for _ in range(max_new_tokens):  # no KV cache: the tiny generate_until tasks are short
            tok = int(np.argmax(self._logits(seq)[-1]))
            out.append(tok)
            seq.append(tok)
            if tok in self.eos_token_ids:
                break
        return out


class ExportBackend:
    """An onnxruntime-genai builder export through OrtDecoder (every position's logits in one call)."""

    def __init__(self, folder: Path):

        self.decoder = OrtDecoder(folder)
        self.max_length = int(self.decoder.genai.get("search", {}).get("max_length") or self.decoder.context_length or 2048)
        self.eos_token_ids = self.decoder.eos_token_ids
        self.ran_on = "cpu (onnxruntime, raipack's OrtDecoder loop over the export's model.onnx)"

    def rows(self, context: list[int], continuation: list[int]) -> np.ndarray:
        full = self.decoder.logits(context + continuation)
        out = full[len(context) - 1: len(context) + len(continuation) - 1]
        if not np.isfinite(out).all():
            raise RaipackError(f"{self.decoder.folder / 'model.onnx'} returns the logits of the last position only, so it cannot score continuations",
                               "export the model without pruning the lm_head to the last token")
        return out

    def generate(self, ids: list[int], max_new_tokens: int) -> list[int]:
        return self.decoder.greedy(ids, max_new_tokens, stop_at_eos=True)[0]


class PackageBackend:
    """A package on the reference runtime (see the module docstring for the NPU)."""

    def __init__(self, folder: Path, why_not_npu: str, numerics: str = "float"):

        self.runtime = ReferenceRuntime(folder, numerics=numerics)
        self.max_length = self.runtime.max_length
        self.max_prompt = self.runtime.max_prompt_length
        self.eos_token_ids = self.runtime.eos_token_ids
        what = "float32 activations" if numerics == "float" else f"{numerics} activations: {HONEST}"
        self.ran_on = f"cpu-reference (raipack's reference runtime, {what}; not the NPU: {why_not_npu})"

    def rows(self, context: list[int], continuation: list[int]) -> np.ndarray:
        rows = [self.runtime.prefill(context).copy()]
        for tok in continuation[:-1]:
            rows.append(self.runtime.step(int(tok)).copy())
        return np.stack(rows)

    def generate(self, ids: list[int], max_new_tokens: int) -> list[int]:
        n = max(1, min(max_new_tokens, self.max_length - len(ids)))
        return self.runtime.generate(ids, n, stop_at_eos=True)


def npu_problem(folder: Path) -> str:
    """Why the package is not run on the NPU here: pipeline/runtime/readiness.py's answer (the one smoke,
    bench and doctor get), or, when the NPU could run it, that raipack eval does not drive it there yet."""

    readiness = npu_readiness(folder)
    if not readiness.ready:
        return readiness.reason
    return f"the NPU could run it ({readiness.library}), but raipack eval does not drive onnxruntime-genai's NPU session yet"


def open_backend(target, numerics: str = "float"):
    """The backend for a Target (pipeline/evaluation/targets.py); `numerics` applies to packages."""

    try:
        if target.kind in ("source", "quark"):
            return TorchBackend(target.path, target.kind)
        if target.kind == "export":
            return ExportBackend(target.path)
        return PackageBackend(target.path, npu_problem(target.path), numerics)
    except (PackageError, RuntimeRefusal) as exc:
        raise RaipackError(f"{target.path} cannot be run: {exc}", "check it with raipack validate --verify-hashes, and rebuild it") from None
