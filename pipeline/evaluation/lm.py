"""The lm-eval `LM` over a backend (pipeline/evaluation/backends.py): loglikelihood,
loglikelihood_rolling and generate_until, one request at a time, on the target's own tokenizer.

Imports lm-eval: load this module only when an evaluation runs."""

from __future__ import annotations

import numpy as np
from lm_eval.api.model import LM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window


def log_softmax(rows: np.ndarray) -> np.ndarray:
    x = np.asarray(rows, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


class RaipackLM(LM):
    """Scores requests with `backend.rows` and generates with `backend.generate`."""

    def __init__(self, backend, tokenizer, max_gen_toks: int = 64):
        super().__init__()
        self.backend, self.tokenizer, self.max_gen_toks = backend, tokenizer, max_gen_toks
        prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        self.prefix_token = int(prefix if prefix is not None else 0)
        self.max_length = int(getattr(backend, "max_prompt", None) or backend.max_length)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's HF convention: trailing spaces of the context go to the continuation, and the
        continuation's ids are those of the whole text after the context's."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        if not context:
            return [self.prefix_token], self._encode(continuation)
        whole, ctx = self._encode(context + continuation), self._encode(context)
        return ctx, whole[len(ctx):]

    def _score(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        keep = max(1, self.max_length - len(continuation))
        context = context[-keep:]  # lm-eval's left truncation to the model's length
        logp = log_softmax(self.backend.rows(context, continuation))
        picked = logp[np.arange(len(continuation)), continuation]
        return float(picked.sum()), bool((logp.argmax(axis=-1) == np.asarray(continuation)).all())

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        return [self._score(*self._pair(*req.args)) for req in requests]

    def loglikelihood_rolling(self, requests) -> list[float]:
        out = []
        for req in requests:
            windows = get_rolling_token_windows(self._encode(req.args[0]), self.prefix_token, self.max_length, 1)
            out.append(sum(self._score(*make_disjoint_window(w))[0] for w in windows))
        return out

    def generate_until(self, requests) -> list[str]:
        out = []
        for req in requests:
            context, kwargs = req.args
            kwargs = dict(kwargs or {})
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            n = int(kwargs.get("max_gen_toks", self.max_gen_toks))
            ids = self._encode(context)[-max(1, self.max_length - n):]
            text = self.tokenizer.decode(self.backend.generate(ids, n), skip_special_tokens=True)
            for stop in until:
                text = text.split(stop)[0]
            out.append(text)
        return out
