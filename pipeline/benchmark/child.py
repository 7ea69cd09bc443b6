"""One backend's measurements, in a process of their own so its memory peak is its own.

Started by pipeline/benchmark/__init__.py as `python -m raipack.benchmark.child` from a fresh empty
folder (nothing is imported from the current folder), with the job as JSON on stdin; prints one
line `raipack-bench-result {...}` on stdout. Every backend is driven by the same greedy loop
(`raipack.runtime.chat.timed_generate`: prefill timed apart from the decode steps), so the
figures compare the runtimes, not two loops:
- reference: raipack's reference runtime on the package (the CPU, the way the NPU runtime would),
  with the job's numerics (float, or bfp16: pipeline/runtime/numerics.py);
- oga: onnxruntime-genai on the unfused export (`Generator.append_tokens`, `get_logits`), or,
  where onnxruntime-genai is not installed, raipack's plain onnxruntime loop (ortloop.py);
- npu: onnxruntime-genai on the package with the RyzenAI provider, only when the model says it
  runs on the NPU (pipeline/runtime/provider.py: og.Model.device_type).
Peak memory: VmHWM of /proc/self/status, reset before each prompt length by writing "5" to
/proc/self/clear_refs where the kernel allows it (else the process's peak so far, and the
scope says so); elsewhere getrusage's ru_maxrss.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

from raipack.runtime.numerics import HONEST
from raipack.runtime.provider import device_problem
from raipack.runtime.reference import ReferenceRuntime
from raipack.runtime.trust import first_line

RESULT = "raipack-bench-result "


def reset_peak() -> bool:
    """Resets the process's peak RSS (VmHWM); False where the kernel does not let it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_mb() -> float:
    """The process's peak RSS in MB (MiB): VmHWM, else ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024 if sys.platform == "darwin" else 1024)


class OgaSteps:
    """prefill/step over an onnxruntime-genai model, the interface timed_generate drives."""

    def __init__(self, og, model, max_length: int):
        self.og, self.model, self.max_length = og, model, max_length
        self.eos_token_ids: set[int] = set()
        self.gen = None

    def prefill(self, ids):
        import numpy as np

        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=self.max_length, do_sample=False)
        self.gen = self.og.Generator(self.model, params)
        self.gen.append_tokens(np.asarray(ids, np.int32))
        return self.gen.get_logits()[0, -1]

    def step(self, token: int):
        import numpy as np

        self.gen.append_tokens(np.asarray([token], np.int32))
        return self.gen.get_logits()[0, -1]


class OrtSteps:
    """prefill/step over raipack's plain onnxruntime loop (pipeline/runtime/ortloop.py)."""

    def __init__(self, folder: Path):
        # late: ortloop loads numpy and onnxruntime, only for the onnxruntime backend
        from raipack.runtime.ortloop import OrtDecoder

        self.dec = OrtDecoder(folder)
        self.eos_token_ids: set[int] = set()
        self.past = None

    def prefill(self, ids):
        logits, self.past = self.dec.prefill(ids, last_only=True)
        return logits[-1]

    def step(self, token: int):
        import numpy as np

        out, self.past = self.dec.forward(np.array([[token]], np.int64), self.past)
        return np.asarray(out, np.float32)[0, -1]


def open_backend(job: dict):
    """(the runtime to drive, what it is, one line) for the job's backend; raises ValueError with one sentence."""
    backend, folder = job["backend"], Path(job["folder"])
    if backend == "reference":
        import onnxruntime as ort


        numerics = job.get("numerics", "float")
        what = "" if numerics == "float" else f"; {numerics} activations, {HONEST}"
        return ReferenceRuntime(folder, numerics=numerics), f"raipack reference runtime (onnxruntime {ort.__version__}, CPU{what})"
    try:
        import onnxruntime_genai as og
    except ImportError:
        if backend == "npu":
            raise ValueError("onnxruntime-genai cannot be imported, so nothing can run on the NPU") from None
        import onnxruntime as ort

        return OrtSteps(folder), f"raipack ortloop (onnxruntime {ort.__version__}, CPU; onnxruntime-genai is not installed)"
    model = og.Model(str(folder))
    if backend == "npu":

        problem = device_problem(model)
        if problem:
            raise ValueError(problem)
    return OgaSteps(og, model, job["max_length"]), f"onnxruntime-genai {og.__version__} ({model.device_type})"


def measure(runtime, prompts: dict, gen: int, runs: int, warmup: int) -> list[dict]:
    """Per prompt length: the warm-up runs, then `runs` timed runs and the peak memory."""
    # late: tests stub chat.timed_generate; loads the tokenizer helpers only when measuring
    from raipack.runtime.chat import timed_generate

    rows, scoped = [], True
    for length, ids in prompts.items():
        scoped = reset_peak() and scoped
        for _ in range(warmup):
            timed_generate(runtime, ids, gen, stop_at_eos=False)
        timed = [timed_generate(runtime, ids, gen, stop_at_eos=False) for _ in range(runs)]
        rows.append({"prompt_tokens": int(length), "ttft_s": [t.ttft for t in timed], "tokens_per_s": [t.decode_tps for t in timed],
                     "gen_tokens": len(timed[0].tokens), "peak_rss_mb": round(peak_mb(), 1), "peak_rss_scope": "length" if scoped else "process"})
    return rows


def main() -> None:
    job = json.loads(sys.stdin.read())
    try:
        runtime, ran_on = open_backend(job)
        rows = measure(runtime, job["prompts"], job["gen"], job["runs"], job["warmup"])
        out = {"ran_on": ran_on, "rows": rows}
    except Exception as exc:  # one sentence back to the parent, which says which backend failed

        out = {"error": str(exc) if isinstance(exc, ValueError) and "\n" not in str(exc) else first_line(exc)}
    print(RESULT + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
