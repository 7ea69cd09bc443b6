"""The reference runtime: runs a raipack reference package on the CPU the way the NPU runtime would.

- Weights: the NPU-side tensors are read from `model.bin` through `model.pb.bin` (offsets and sizes
  checked against the file at load, sha256 of every tensor checked at load unless `verify="sizes"`)
  and handed to onnxruntime as external initializers, so onnxruntime never reads `model.bin` itself.
  `model.onnx` must reference exactly the offsets the header lists.
- Plans (checked by pipeline/runtime/load_checks.py, with the header and the external data): every
  tier's `dd_metastate_*.plan` is loaded, its `.state` must name the plan's, the
  header's and the graph's sha256, the plan must name its phase's shared schedule
  (`cache/<node>_<phase>.schedule.json`) with that file's sha256, and be consistent with it.
  A plan of an older format version is refused with one sentence: rebuild the package.
- KV cache: one static buffer of `search.max_length` positions per layer for keys and values, shared
  between past and present (onnxruntime's GroupQueryAttention with past_present_share_buffer). A call
  binds the window of the smallest token tier that holds its last position, as that tier's plan
  describes ([1, kv_heads, W, head_size] at the start of each layer's region); growing into the next
  tier re-lays the filled positions out in place.
- Prefill: the prompt is right-padded up to the smallest prefill tier that holds it. With
  `hybrid_opt_chunk_context` "1", one call takes at most `search.chunk_size` tokens (the settings'
  `one_pass()`, which `raipack tune --chunk-size` lowers): a longer prompt runs in chunks of that
  size, the last one padded to its tier. Without chunking a prompt is one call (its length is capped
  at the largest prefill tier). Padding only ever sits after the real tokens: the causal mask
  hides it from them, and the KV rows it writes lie beyond the real length, where the next tokens
  overwrite them before anything reads them.
- Token phase: one token per call, with the plan of the token tier that holds the new length.
- A hybrid package (NPU prefill, iGPU decode; its header lists no tiers and it has no plans): every
  call binds the whole KV buffer of `search.max_length` positions, the prompt runs unpadded in calls
  of at most `hybrid_opt_max_seq_length` tokens, then one token per call.
- Numerics (`numerics="bfp16"`, pipeline/runtime/numerics.py): the fused functions are rewritten
  in memory at load with Quark's BFP16 quantize-dequantize and bfloat16 rounding where the NPU
  keeps those formats, and the KV positions each call writes are rounded to bfloat16 after it.
- Refusals: a prompt longer than `rai_config.max_prompt_length` for the SDK version, or a request
  beyond `search.max_length`, raises `RuntimeRefusal` whose str() is one sentence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from raipack.npu import formats
from raipack.npu.constraints import placed_as_header_says, stored_in
from raipack.npu.formats import FormatError
from raipack.npu.genai import ryzenai_options
from raipack.npu.settings import NpuSettings
from raipack.runtime import numerics as numerics_mod
from raipack.runtime.load_checks import PlanContext, check_external_data, check_header_fields, load_plan, load_schedule, offset_length
from raipack.runtime.trust import GRAPH_MAX_BYTES, PackageError, PackageFiles, first_line


class RuntimeRefusal(ValueError):
    """A request the package cannot serve (too long a prompt or sequence); str() is one sentence."""

    def __init__(self, message: str, limit: int | None = None, requested: int | None = None):
        super().__init__(message)
        self.limit = limit
        self.requested = requested


class ReferenceRuntime:
    """Loads a reference package and runs greedy generation on the CPU (see the module docstring)."""

    graph_edited = False  # a subclass that edits the graph in memory (pipeline/runtime/scoring.py) sets it

    def __init__(self, pkg_dir: str | Path, threads: int | None = None, *, verify: str = "sha256", sdk_version: str | None = None,
                 numerics: str = "float"):
        self.pkg = Path(pkg_dir)
        self.numerics = numerics_mod.check_mode(numerics)
        self._library = numerics_mod.quark_library(untrusted=(self.pkg,)) if numerics != "float" else None
        self.files = PackageFiles(self.pkg)  # nothing special, nothing outside the package
        manifest = self.files.check_manifest(hashes=verify == "sha256")  # hashes on a thread meanwhile
        self.genai = self.files.json("genai_config.json", "genai_config")
        header_name, header_path = self._open_weights(verify)
        header = self.weights.header
        self.dims = header["model"]
        self.num_layers, self.kv_heads, self.head_size = self.dims["layers"], self.dims["kv_heads"], self.dims["head_size"]
        self.vocab_size = self.dims["vocab_size"]
        self._read_settings(header, sdk_version)
        self._read_special_tokens()
        graph_path, graph_bytes, model, names, values = self._load_graph(header_name)
        self.plans = self._load_plans(header_path, graph_bytes)
        # every weights file as manifest.json recorded it, and the rest of the graph's external data in bounds
        self.manifest_checked = manifest.result()
        check_external_data(self.files, model, graph_path, header.get("weights_file", "model.bin"))
        self._start_session(graph_path, model, names, values, threads)
        self._allocate()

    # ------------------------------------------------------------------ loading steps

    def _open_weights(self, verify: str) -> tuple[str, Path]:
        """model.pb.bin (the RyzenAI option external_data_file) and model.bin, checked; (name, path) of the header."""
        opts, _ = ryzenai_options(self.genai)
        if not opts:
            raise PackageError(f"{self.pkg / 'genai_config.json'} has no RyzenAI provider options; it is not an NPU package", "fuse the export with raipack's reference backend")
        header_name = opts.get("external_data_file", "model.pb.bin")
        header_path = self.files.path(header_name, "genai_config.json's RyzenAI option external_data_file")
        if not formats.is_reference_header(header_path):
            raise PackageError(f"{header_path} is not a raipack reference header (missing, or another format such as AMD's): the reference runtime only runs packages raipack's reference backend wrote",
                               "run AMD packages with AMD's Ryzen AI runtime on an NPU")
        try:
            self.weights = formats.WeightsFile(header_path, verify=verify)
        except FormatError as err:
            raise PackageError(str(err), err.hint) from None
        check_header_fields(self.weights.header, header_path)
        return header_name, header_path

    def _read_settings(self, header: dict, sdk_version: str | None) -> None:
        """Lengths, tiers, chunking and the prompt limit: the package's NPU settings (pipeline/npu/settings.py)
        with the header's tiers, held to what the runtime needs."""
        tiers = header["tiers"]
        rai = self.files.json("rai_config.json", "rai_config", required=False) or {}
        settings = NpuSettings.from_configs(self.genai, rai, tiers["prefill"], tiers["token"])
        self.settings = settings
        self.prefill_tiers, self.token_tiers, self.node = settings.prefill, settings.token, tiers["node"]
        self.max_length = settings.max_length or 0
        if self.max_length != tiers["max_length"] or self.max_length > (self.token_tiers or [self.max_length])[-1]:
            raise PackageError(f"genai_config.json search.max_length {self.max_length} does not match the {tiers['max_length']} the package was built for", "rebuild the package; do not edit max_length by hand")
        self.chunked = settings.chunked
        if not self.prefill_tiers:  # hybrid: no tiers; one NPU pass is hybrid_opt_max_seq_length
            self.chunk_size = self.one_pass = self._hybrid_pass(settings)
        else:
            self.chunk_size = settings.chunk_size or self.prefill_tiers[-1]
            if self.chunk_size not in self.prefill_tiers:
                raise PackageError(f"search.chunk_size {self.chunk_size} is not one of the prefill tiers {self.prefill_tiers}", "rebuild the package")
            # the longest prefill call: the chunk with chunked prefill, else the largest tier (prompts are capped to it)
            self.one_pass = self.chunk_size if self.chunked else self.prefill_tiers[-1]
        mpl = rai.get("max_prompt_length") or {}
        self.sdk_version = sdk_version or header.get("release")
        if mpl:
            if self.sdk_version not in mpl:
                raise PackageError(f"rai_config.json gives no max_prompt_length for Ryzen AI {self.sdk_version} (it lists {', '.join(sorted(mpl))})", "pass sdk_version= one of the listed versions")
        self.max_prompt_length = settings.prompt_cap(int(mpl[self.sdk_version]) if mpl else self.max_length)

    def _hybrid_pass(self, settings: NpuSettings) -> int:
        """The longest prefill call of a package without tiers: hybrid_opt_max_seq_length, within max_length."""
        if not settings.npu_seq or settings.npu_seq > self.max_length:
            raise PackageError(f"genai_config.json RyzenAI option hybrid_opt_max_seq_length is {settings.npu_seq}; a package without tiers needs a positive one within search.max_length {self.max_length}",
                               "rebuild the package")
        return settings.npu_seq

    def _read_special_tokens(self) -> None:
        eos = self.genai["model"].get("eos_token_id", [])
        self.eos_token_ids = {int(e) for e in (eos if isinstance(eos, list) else [eos])}
        pad = self.genai["model"].get("pad_token_id")
        self.pad_token_id = int((pad[0] if isinstance(pad, list) else pad) or 0)

    def _load_graph(self, header_name: str):
        """The decoder graph, which must point into model.bin exactly where the header says; returns
        (path, bytes, model, names and OrtValues of the model.bin tensors)."""
        import onnx
        import onnxruntime as ort

        graph_name = self.genai["model"]["decoder"].get("filename", "model.onnx")
        graph_path = self.files.path(graph_name, "genai_config.json model.decoder.filename")
        graph_bytes = self.files.read(graph_name, "genai_config.json model.decoder.filename", GRAPH_MAX_BYTES, "decoder graph")
        try:
            model = onnx.load_from_string(graph_bytes)
        except Exception as err:  # protobuf's DecodeError and friends: the file is not an ONNX model
            raise PackageError(f"{graph_path} cannot be parsed as an ONNX model ({type(err).__name__})", "rebuild the package; the file is truncated or corrupt") from None
        names, values = [], []
        for t, ext in stored_in(model.graph, self.weights.header.get("weights_file", "model.bin")):
            offset_length(ext, f"{graph_path.name} (external data of tensor {t.name!r})")  # whole numbers, else one sentence
            if not placed_as_header_says(t, ext, self.weights.tensors.get(t.name)):
                raise PackageError(f"{graph_path.name} and {header_name} disagree about tensor {t.name} (offset, length or shape)", "rebuild the package; model.onnx and model.pb.bin come from different builds")
            names.append(t.name)
            values.append(ort.OrtValue.ortvalue_from_numpy(self.weights.array(t.name)))
        self._ort_values = values
        return graph_path, graph_bytes, model, names, values

    def _load_plans(self, header_path: Path, graph_bytes: bytes) -> dict[tuple[str, int], dict]:
        header_sha = formats.sha256_hex(header_path.read_bytes())
        graph_sha = formats.sha256_hex(graph_bytes)
        model_dims = {k: self.dims[k] for k in ("layers", "kv_heads", "head_size", "vocab_size")}
        schedules: dict = {}

        def schedule(phase):  # read when the first plan of the phase is known to be of this format version
            if phase not in schedules:
                schedules[phase] = load_schedule(self.files, self.node, phase)
            return schedules[phase]

        ctx = PlanContext(self.files, self.node, self.max_length, header_sha, graph_sha, model_dims)
        return {(phase, tier): load_plan(ctx, phase, tier, schedule)
                for phase, tier_list in (("prefill", self.prefill_tiers), ("token", self.token_tiers)) for tier in tier_list}

    def _start_session(self, graph_path: Path, model, names: list, values: list, threads: int | None) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        if threads is not None:
            so.intra_op_num_threads = int(threads)
            so.inter_op_num_threads = 1
        so.add_external_initializers(names, values)
        graph: str | bytes = str(graph_path)
        self.rounding = {}
        if self._library is not None:  # the rewritten graph, from memory; its other external data still from the package
            model, self.rounding = numerics_mod.rewrite(model, self.numerics)
            so.register_custom_ops_library(str(self._library))
        if self._library is not None or self.graph_edited:
            graph = model.SerializeToString()
            so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(graph_path.parent))
        try:
            self.session = ort.InferenceSession(graph, so, providers=["CPUExecutionProvider"])
        except Exception as err:  # onnxruntime's Fail/InvalidGraph/...: the graph does not load
            raise PackageError(f"onnxruntime cannot load {graph_path}: {first_line(err)}", "rebuild the package; validate it with raipack validate") from None
        dec = self.genai["model"]["decoder"]
        ins, outs = dec.get("inputs", {}), dec.get("outputs", {})
        self.input_ids_name = ins.get("input_ids", "input_ids")
        self.attention_mask_name = ins.get("attention_mask", "attention_mask")
        self.logits_name = outs.get("logits", "logits")

    def _allocate(self) -> None:
        """The static KV buffer (one region of max_length positions per layer for keys and for values),
        the logits row and the I/O binding."""
        import numpy as np
        import onnxruntime as ort

        self._region = self.max_length * self.kv_heads * self.head_size
        self._kv = np.zeros(2 * self.num_layers * self._region, np.float32)
        self._ones = np.ones((1, self.max_length), np.int64)
        self._logits = np.zeros((1, 1, self.vocab_size), np.float32)
        self._binding = self.session.io_binding()
        self._binding.bind_output(self.logits_name, "cpu", 0, np.float32, list(self._logits.shape), self._logits.ctypes.data)
        self._window = 0
        self._fast_lo = self._fast_hi = 0  # token steps ending in (lo, hi] reuse the bound tier
        self._tok = np.zeros((1, 1), np.int64)
        self._tok_value = ort.OrtValue.ortvalue_from_numpy(self._tok)
        self._tok_value_bound = False
        self._kv_values: list = []
        self.filled = 0  # positions of the KV buffer that hold real tokens
        self.calls: list[tuple[str, int, int]] = []  # (phase, tier, window) of every call since the last prefill

    # ------------------------------------------------------------------ the KV window

    def _window_for(self, end: int) -> int:
        for t in self.token_tiers or [self.max_length]:  # hybrid: the whole buffer
            if t >= end:
                return t
        raise RuntimeRefusal(f"position {end} is beyond the package's maximum length of {self.max_length} tokens", self.max_length, end)

    def _bind_window(self, window: int) -> None:
        import onnxruntime as ort

        if window == self._window:
            return
        bindings = self.plans[("token", window)]["kv_cache"]["bindings"] if self.token_tiers else self._whole_buffer()
        es = 4  # float32
        if self._window and self.filled:
            old, hs = self._window, self.head_size
            order = list(reversed(range(self.kv_heads))) if window > old else list(range(self.kv_heads))
            for b in bindings:
                base = b["offset"] // es
                for h in order:  # growing: back to front, shrinking: front to back; never overwrites unread data
                    src = self._kv[base + h * old * hs: base + h * old * hs + self.filled * hs]
                    self._kv[base + h * window * hs: base + h * window * hs + self.filled * hs] = src.copy()
        self._kv_values = []
        for b in bindings:
            base = b["offset"] // es
            view = self._kv[base: base + b["bytes"] // es].reshape(b["shape"])
            value = ort.OrtValue.ortvalue_from_numpy(view)
            self._kv_values.append((view, value))
            self._binding.bind_ortvalue_input(b["past"], value)
            self._binding.bind_ortvalue_output(b["present"], value)
        self._window = window

    def _whole_buffer(self) -> list[dict]:
        """The KV bindings of a package without plans (hybrid): layer i's keys and values, each one
        region of max_length positions, in the static buffer's order."""
        dec = self.genai["model"]["decoder"]
        ins, outs = dec.get("inputs", {}), dec.get("outputs", {})
        shape = [1, self.kv_heads, self.max_length, self.head_size]
        out = []
        for i in range(self.num_layers):
            for k, (past, present) in enumerate(((ins.get("past_key_names", "past_key_values.%d.key"), outs.get("present_key_names", "present.%d.key")),
                                                 (ins.get("past_value_names", "past_key_values.%d.value"), outs.get("present_value_names", "present.%d.value")))):
                out.append({"past": past % i, "present": present % i, "offset": (2 * i + k) * self._region * 4, "shape": shape, "bytes": self._region * 4})
        return out

    def _round_kv(self, lo: int, hi: int) -> None:
        """Under bfp16 numerics, the KV positions [lo, hi) the last call wrote, rounded to bfloat16
        (the NPU keeps past_key_values/present in bfloat16)."""
        if self._library is None:
            return
        for view, _ in self._kv_values:
            numerics_mod.round_bfloat16(view[:, :, lo:hi, :])

    # ------------------------------------------------------------------ one call

    def _call(self, phase: str, tokens, seq: int):
        """Runs `tokens` (real ids, len ≤ seq) padded to `seq` positions after `self.filled`."""
        import numpy as np

        n, past = len(tokens), self.filled
        end = past + seq
        if end > self.max_length:
            raise RuntimeRefusal(f"{past + n} tokens padded to {end} positions do not fit the package's maximum length of {self.max_length}", self.max_length, end)
        window = self._window_for(end)
        tier = seq if phase == "prefill" else window
        plan = self.plans.get((phase, tier)) if self.token_tiers else {"sequence_length": seq, "kv_window": window}
        if plan is None or plan["sequence_length"] != seq or (phase == "token" and plan["kv_window"] != window) or (phase == "prefill" and past == 0 and plan["kv_window"] != window):
            raise PackageError(f"the {phase} plan of tier {tier} does not describe this call ({seq} positions over a {window}-position window)", "rebuild the package")
        self._bind_window(window)
        if seq == n:
            ids = np.asarray(tokens, np.int64).reshape(1, n)
        else:
            ids = np.full((1, seq), self.pad_token_id, np.int64)
            ids[0, :n] = tokens
        if n == seq:
            mask = self._ones[:, :end]
        else:
            mask = np.ones((1, end), np.int64)
            mask[0, past + n:] = 0
        self._binding.bind_cpu_input(self.input_ids_name, ids)
        self._binding.bind_cpu_input(self.attention_mask_name, mask)
        self.session.run_with_iobinding(self._binding)
        self._round_kv(past, end)
        self.filled = past + n
        self.calls.append((phase, tier, window))
        return self._logits[0, 0]

    def prefill(self, prompt_ids: Sequence[int]):
        """Resets the KV buffer and runs the prompt; returns the last prompt token's logits row (a view)."""
        import numpy as np

        ids = np.asarray(prompt_ids, dtype=np.int64).reshape(-1)
        n = int(ids.size)
        if n == 0:
            raise RuntimeRefusal("the prompt is empty; give at least one token id", self.max_prompt_length, 0)
        if n > self.max_prompt_length:
            raise RuntimeRefusal(f"the prompt of {n} tokens exceeds the package's maximum prompt length of {self.max_prompt_length} tokens (rai_config.json, Ryzen AI {self.sdk_version})", self.max_prompt_length, n)
        self.filled, self._window, self._fast_hi = 0, 0, 0
        self.calls.clear()
        step = self.one_pass
        chunks = [ids[s: s + step] for s in range(0, n, step)]
        row = None
        for chunk in chunks:
            tier = next((t for t in self.prefill_tiers if t >= chunk.size), chunk.size)  # hybrid: unpadded
            row = self._call("prefill", chunk, tier)
        return row

    def prefill_calls(self) -> list[int]:
        """The prefill tier of each call the last prefill made (one per chunk)."""
        return [tier for phase, tier, _ in self.calls if phase == "prefill"]

    def step(self, token: int):
        """Runs one generated token after the current sequence; returns its logits row (a view)."""
        end = self.filled + 1
        if not self._fast_lo < end <= self._fast_hi:  # another tier (or the first step): full checks and binding
            row = self._call("token", [int(token)], 1)
            lower = [t for t in self.token_tiers if t < self._window]
            self._fast_lo, self._fast_hi = (lower[-1] if lower else 0), self._window
            self._tok_value_bound = False
            return row
        # the fast path: same window, same plan; only the token and the mask length change
        self._tok[0, 0] = token
        if not self._tok_value_bound:
            self._binding.bind_ortvalue_input(self.input_ids_name, self._tok_value)
            self._tok_value_bound = True
        self._binding.bind_cpu_input(self.attention_mask_name, self._ones[:, :end])
        self.session.run_with_iobinding(self._binding)
        self._round_kv(end - 1, end)
        self.filled = end
        self.calls.append(("token", self._window, self._window))
        return self._logits[0, 0]

    # ------------------------------------------------------------------ public API

    def generate(self, input_ids: Sequence[int], max_new_tokens: int, *, stop_at_eos: bool = False, return_logits: bool = False):
        """Greedy decoding: `max_new_tokens` new token ids (fewer with `stop_at_eos` after an EOS id).
        With `return_logits`, returns (tokens, the logits row each token was chosen from)."""
        import numpy as np

        n = len(input_ids)
        if max_new_tokens < 1:
            raise RuntimeRefusal(f"max_new_tokens is {max_new_tokens}; ask for at least one token", None, max_new_tokens)
        if n + max_new_tokens > self.max_length:
            raise RuntimeRefusal(f"{n} prompt tokens plus {max_new_tokens} new tokens exceed the package's maximum length of {self.max_length} tokens", self.max_length, n + max_new_tokens)
        row = self.prefill(input_ids)
        tokens, rows = [], []
        for i in range(int(max_new_tokens)):
            tok = int(np.argmax(row))
            tokens.append(tok)
            if return_logits:
                rows.append(row.copy())
            if (stop_at_eos and tok in self.eos_token_ids) or i == max_new_tokens - 1:
                break
            row = self.step(tok)
        return (tokens, rows) if return_logits else tokens
