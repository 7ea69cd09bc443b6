"""RyzenAI provider options: types, allowed values and the files they name."""

from __future__ import annotations

from raipack.checks.base import check
from raipack.npu import linux
from raipack.npu.genai import known_options as known
from raipack.npu.genai import provider_names
from raipack.npu.layout import weights_sibling
from raipack.npu.opened import cache_dir
from raipack.npu.settings import is_power_of_two

GENAI = "genai_config.json"


def _ryzen_keys(ctx):
    """Options that are runtime options (not ONNX Runtime session settings)."""
    opts, where = ctx.options
    session_keys = set(known()["session_keys"])
    for key, value in opts.items():
        if key not in session_keys or "/config_entries/" in where[key] or "/RyzenAI/" in where[key]:
            yield key, value, where[key]


@check("RP401", "option-strings")
def option_strings(ctx):
    """Every RyzenAI option value is a string ("4096", not 4096): the runtime
    reads them as strings and rejects other JSON types. Options that hold a
    length or a count (`hybrid_opt_max_seq_length`, `max_length_for_kv_cache`,
    `hybrid_opt_chunk_context_threshold`, ...) are decimal digits, and the
    lengths at least 1: "-1" or "4k" is not a length."""
    counts = {k: v for k, v in known()["whole_numbers"].items() if not k.startswith("$")}
    for key, value, pointer in _ryzen_keys(ctx):
        if not isinstance(value, str):
            yield ctx.finding(GENAI, f"option {key} is {value!r} ({type(value).__name__}); expected a string such as \"{value}\"", "quote the value", pointer)
        elif key in counts and not (value.isascii() and value.isdecimal() and len(value) < 19 and int(value) >= counts[key]):
            least = "a whole number" if counts[key] == 0 else f"a whole number of at least {counts[key]}"
            yield ctx.finding(GENAI, f"option {key} is {value[:40]!r}; expected {least} written as a string, such as \"4096\"", "write the length as decimal digits", pointer)


@check("RP402", "seq-length-power-of-two")
def power_of_two(ctx):
    """`hybrid_opt_max_seq_length` (and any option the profile marks) is a
    power of two, as the runtime requires."""
    opts, where = ctx.options
    marked = {k for k, v in ctx.profile.genai.options.items() if v.power_of_two}
    for key in sorted(marked | {"hybrid_opt_max_seq_length"}):
        if key in opts and not is_power_of_two(opts[key]):
            yield ctx.finding(GENAI, f"option {key} is {opts[key]!r}; expected a power of two such as \"4096\"", "use the nearest power of two at or below the length the package was built for", where[key])


@check("RP403", "token-backend")
def token_backend(ctx):
    """`hybrid_opt_token_backend` is `npu` or `gpu`, nothing else."""
    opts, where = ctx.options
    allowed = known()["token_backends"]
    if "hybrid_opt_token_backend" in opts and opts["hybrid_opt_token_backend"] not in allowed:
        yield ctx.finding(GENAI, f"option hybrid_opt_token_backend is {opts['hybrid_opt_token_backend']!r}; expected one of {', '.join(allowed)}", "set it to \"npu\" for an NPU package", where["hybrid_opt_token_backend"])


@check("RP404", "external-data-file")
def external_data_file(ctx):
    """`external_data_file` names a header that is in the package, and its
    sibling weights file (model.pb.bin → model.bin) is there too."""
    opts, where = ctx.options
    header = opts.get("external_data_file")
    if not isinstance(header, str):
        return
    pointer = where["external_data_file"]
    if header not in ctx.pkg.files:
        yield ctx.finding(GENAI, f"option external_data_file names {header!r}, which is not in the package", "copy the NPU header file into the package", pointer)
    sibling = weights_sibling(header)
    if sibling not in ctx.pkg.files:
        yield ctx.finding(sibling, f"is missing: it holds the NPU weights that {header} indexes", "copy the NPU weights file into the package", pointer)


@check("RP405", "cache-folder")
def cache_folder(ctx):
    """An NPU package (token backend npu, or an external_data_file) has a
    `cache/` or `.cache/` folder next to its graph: the runtime reads the
    per-node meta files from there."""
    opts, _ = ctx.options
    needs = opts.get("hybrid_opt_token_backend") == "npu" or ctx.profile.metastate.required
    if needs and cache_dir(ctx.genai, ctx.pkg.dirs) is None:
        yield ctx.finding("cache", "is missing: an NPU package needs a cache/ or .cache/ folder beside its graph", "copy the package's cache/ folder too")


@check("RP406", "profile-options")
def profile_options(ctx):
    """The options the profile requires are present with allowed values; 1.7+
    packages carry a `RyzenAI` provider block; options unknown to the runtime
    are reported as probable typos (warning). A missing required option is an
    error where the package cannot load without it (`load_bearing` in
    pipeline/data/ryzenai_options.json: the custom-op library, the weights
    header), a warning otherwise; so is a value other than the profile's
    (the runtime runs with it: RP402/RP403 report the values it refuses)."""
    prof = ctx.profile
    genai = ctx.genai
    if not isinstance(genai, dict):
        return
    opts, where = ctx.options
    if prof.genai.form == "provider_options" and "RyzenAI" not in provider_names(genai):
        yield ctx.finding(GENAI, f"has no RyzenAI provider block; profile {prof.id} expects provider_options: [{{\"RyzenAI\": {{...}}}}]", "add the RyzenAI block with the profile's options", "/model/decoder/session_options/provider_options")
        return
    for key, rule in prof.genai.options.items():
        if key not in opts:
            if rule.required:
                why = known()["load_bearing"].get(key)
                yield ctx.finding(GENAI, f"option {key} is missing; profile {prof.id} requires it" + (f": {why}" if why else ""), "add it to the RyzenAI options",
                                  "/model/decoder/session_options", None if why else "warning")
            continue
        if key == "hybrid_opt_token_backend" and opts[key] not in known()["token_backends"]:
            continue  # RP403 reports a value the runtime rejects outright
        if rule.allowed and str(opts[key]) not in rule.allowed:
            yield ctx.finding(GENAI, f"option {key} is {opts[key]!r}; profile {prof.id} expects {' or '.join(map(repr, rule.allowed))}", "use the value of the release the package targets", where[key], "warning")
    names = known()["options"]
    session_keys = set(known()["session_keys"])
    for key, _value, pointer in _ryzen_keys(ctx):
        if key not in names and key not in session_keys:
            yield ctx.finding(GENAI, f"option {key} is not an option the RyzenAI runtime reads", "check the spelling against `raipack checks RP406`", pointer, "warning")


@check("RP407", "linux-deployment")
def linux_deployment(ctx):
    """With `--platform linux`: the package can run on Linux as AMD documents it for its release
    (docs/llm_linux.rst of the release branch, the catalog's `linux` block). An error for each
    documented edit its files lack (1.6 NPU packages: `custom_ops_library` naming the Linux
    `libonnx_custom_ops.so`, `hybrid_dbg_use_aie_rope` "0", slashes in `.cache/*_meta.json`; AMD:
    they "have to be updated to make it work for Linux"; `raipack tune --platform linux` makes
    them) and for a hybrid package where the release says "Linux does not support Hybrid flow"
    (1.8). A warning where AMD documents no Linux deployment for the release: what it needs there
    is unknown. Without `--platform linux` the check says nothing."""
    if ctx.platform != "linux":
        return
    stop = linux.refusal(ctx.profile)
    if stop is not None:
        severity, message, hint = stop
        yield ctx.finding(".", message, hint, severity=severity)
        return
    release = ctx.profile.release
    for edit in linux.pending(ctx.pkg, release):
        where = " (the value names your install: deployment/ copied into the folder you run from)" if edit.install_path else ""
        yield ctx.finding(edit.file, f"{edit.what}: {edit.why}{where}", "raipack tune --platform linux PACKAGE makes AMD's documented edits", edit.pointer)
