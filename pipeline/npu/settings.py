"""One typed model of a package's NPU settings: lengths, compiled tiers, chunking, the KV buffer and
the longest prompt per Ryzen AI version.

Built two ways, and read by everyone that needs them:
- `NpuSettings.from_profile(profile, context_length)`: what the fuse stage writes for a model of
  that context under a profile (and raises SettingsError when no package can be built);
- `NpuSettings.from_configs(genai, rai_config, prefill, token)` / `from_package(pkg, profile)`: what
  a package's files say (checks, the reference runtime, tune, summary).

The fuse stage and the advice checks share `max_length_for` and `fit_to_chunk`, so a package raipack
builds is one raipack's own advice accepts.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Mapping

from raipack.core.errors import RaipackError
from raipack.npu.genai import ryzenai_options, table
from raipack.npu.layout import tiers_present
from raipack.npu.spec import OptionRule, Profile

SDK_ENV = "RAIPACK_SDK_VERSION"  # the Ryzen AI version the package will run on
INSTALL_ENV = "RYZEN_AI_INSTALLATION_PATH"  # set by AMD's installer, ends in the version
INSTALL_VERSION = re.compile(r"(\d+\.\d+(?:\.\d+)*)[\\/]*$")  # the version folder AMD's installer writes (C:\Program Files\RyzenAI\1.8.0)


def installed_sdk_version(path: str | None = None) -> str | None:
    """The Ryzen AI version the install folder `path` (default $RYZEN_AI_INSTALLATION_PATH) ends in, else None."""
    match = INSTALL_VERSION.search(os.environ.get(INSTALL_ENV, "") if path is None else path)
    return match[1] if match else None


class SettingsError(RaipackError):
    """A profile that cannot make a package for a model; str() is the sentence, `hint` the next step."""


# -- numbers -----------------------------------------------------------------

def as_int(value):
    """An int from an int or a string of decimal digits ("4096"), else None
    (a mistyped value is RP202's or RP401's finding, never a crash here)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdecimal():
        try:
            return int(value)
        except ValueError:  # more digits than Python converts
            return None
    return None


def as_count(value):
    """A positive int (a length, a dimension), else None."""
    n = as_int(value)
    return n if n is not None and n > 0 else None


def is_power_of_two(text) -> bool:
    try:
        n = int(str(text))
    except ValueError:
        return False
    return n > 0 and n & (n - 1) == 0


def pow2_floor(n: int) -> int:
    """The largest power of two at or below n (n >= 1)."""
    return 1 << (n.bit_length() - 1)


def pow2_ceil(n: int) -> int:
    """The smallest power of two at or above n."""
    return 1 << max(0, (n - 1).bit_length())


def fit_to_chunk(n: int, chunk: int) -> int:
    """The largest multiple of `chunk` at or below n (at least one chunk)."""
    return max(chunk, n // chunk * chunk)


# -- tiers and lengths from a profile -----------------------------------------

def tiers_up_to(tiers, max_length: int) -> list[int]:
    """The tiers a package of `max_length` holds: the profile's tiers below it, and max_length
    itself as the last one (the static KV buffer's size), as AMD's lists end (…3968, 4096). A
    max_length above every tier adds none."""
    if not tiers or max_length > max(tiers):
        return sorted(tiers)
    return sorted({t for t in tiers if t < max_length} | {max_length})


def expected_tiers(tiers, phase: str, max_length: int | None) -> list[int]:
    """The `phase` tiers of a profile that a package of `max_length` holds (all of them when
    max_length is unknown): prefill tiers up to it; token tiers as `tiers_up_to`."""
    if not max_length or not tiers:
        return sorted(tiers)
    if phase == "token":
        return tiers_up_to(tiers, max_length)
    return sorted(t for t in tiers if t <= max_length)


def max_length_for(profile: Profile, context_length: int | None) -> int:
    """search.max_length of a package built for `profile` from a model of `context_length` positions:
    within the profile's max_length and the model's context; a multiple of search.chunk_size where
    the profile's advice asks for one (RP005), else its largest token tier."""
    search = profile.genai.search
    token = sorted(profile.buckets.token)
    prof_max = int(search.get("max_length") or token[-1])
    limit = min(prof_max, context_length) if context_length else prof_max
    if not token:  # a tierless layout (hybrid: decode on the iGPU): the KV buffer takes the whole length
        return limit
    chunk = as_count(search.get("chunk_size"))
    rule = profile.advice.max_length or {}
    if chunk and rule.get("multiple_of_chunk") and limit >= chunk and limit >= token[0]:
        return fit_to_chunk(limit, chunk)
    fits = [t for t in token if t <= limit]
    if not fits:
        raise SettingsError(
            f"the model's context of {context_length} positions is below every token tier of profile {profile.id} ({token})",
            "choose a profile whose token tiers fit the model's context length")
    return fits[-1]


# -- the model ----------------------------------------------------------------

@dataclass
class NpuSettings:
    max_length: int | None = None  # search.max_length: the static KV buffer's positions
    chunk_size: int | None = None  # search.chunk_size
    context_length: int | None = None  # model.context_length
    kv_cache: int | None = None  # option max_length_for_kv_cache
    npu_seq: int | None = None  # option hybrid_opt_max_seq_length: one NPU pass
    chunked: bool = False  # option hybrid_opt_chunk_context "1": prompts run in chunks
    max_prompt: dict[str, int] = field(default_factory=dict)  # Ryzen AI version -> longest prompt
    prefill: list[int] = field(default_factory=list)  # compiled prefill tiers
    token: list[int] = field(default_factory=list)  # compiled token tiers

    # ---- built from a profile: what the fuse stage writes

    @classmethod
    def from_profile(cls, profile: Profile, context_length: int | None) -> "NpuSettings":
        search = profile.genai.search
        max_length = max_length_for(profile, context_length)
        if profile.tierless:
            return cls._tierless(profile, max_length, context_length)
        token = expected_tiers(profile.buckets.token, "token", max_length)
        prefill = expected_tiers(profile.buckets.prefill, "prefill", max_length)
        if not prefill:
            raise SettingsError(f"profile {profile.id} has no prefill tier at or below max_length {max_length}", "fix the profile's prefill tiers")
        chunk = search.get("chunk_size")
        if chunk is not None and int(chunk) not in prefill:
            raise SettingsError(f"profile {profile.id} sets chunk_size {chunk}, which is not one of its prefill tiers {prefill}",
                                "make chunk_size one of the prefill tiers: every prefill chunk runs a tier's plan")
        table = {v: int(n) for v, n in profile.max_prompt_length.items()}
        chunked = _chunked(profile.genai.options, any(min(n, max_length) > prefill[-1] for n in table.values()))
        out = cls(max_length=max_length, chunk_size=int(chunk) if chunk is not None else None, context_length=context_length,
                  npu_seq=prefill[-1], chunked=chunked, prefill=prefill, token=token)
        out.max_prompt = {v: out.prompt_cap(n) for v, n in table.items()}
        return out

    @classmethod
    def _tierless(cls, profile: Profile, max_length: int, context_length: int | None) -> "NpuSettings":
        """A layout without compiled tiers (hybrid: NPU prefill, iGPU decode): one NPU pass is the
        largest power of two within the layout's `prefill_pass` and max_length; no chunking."""
        if profile.layout.prefill_pass is None:
            raise SettingsError(f"profile {profile.id} ({profile.source}) has no tiers and no layout.prefill_pass, so one NPU pass has no length",
                                "give the profile layout.prefill_pass (the longest NPU prefill pass), or its buckets")
        npu_seq = pow2_floor(min(profile.layout.prefill_pass, max_length))
        out = cls(max_length=max_length, context_length=context_length, npu_seq=npu_seq)
        out.max_prompt = {v: out.prompt_cap(int(n)) for v, n in profile.max_prompt_length.items()}
        return out

    def largest_pass(self) -> int | None:
        """The longest prompt one NPU call takes: the largest prefill tier, else (a tierless layout)
        hybrid_opt_max_seq_length."""
        return self.prefill[-1] if self.prefill else self.npu_seq

    def prompt_cap(self, n: int) -> int:
        """The longest prompt the package serves of a Ryzen AI version that takes `n` tokens: within
        max_length, and within the largest prefill tier unless prompts run in chunks (a length the
        package does not set caps nothing)."""
        if self.max_length is not None:
            n = min(n, self.max_length)
        largest = self.largest_pass()
        return n if self.chunked or largest is None else min(n, largest)

    def known_max_length(self) -> int:
        """search.max_length, which what the fuse stage writes is derived from."""
        if self.max_length is None:
            raise SettingsError("search.max_length is not set, so the NPU options and tiers cannot be derived", "set search.max_length in genai_config.json or the profile")
        return self.max_length

    def build_values(self) -> dict:
        """The values a profile's option templates ("{npu_seq}", "{max_length}", ...) are filled with."""
        max_length = self.known_max_length()
        return {"max_length": max_length, "max_length_pow2": pow2_floor(max_length), "npu_seq": self.npu_seq,
                "chunked": "1" if self.chunked else "0"}

    def provider_options(self, profile: Profile) -> dict:
        """The RyzenAI options the fuse stage writes: the profile's `build` templates filled in."""
        values = self.build_values()
        return {name: rule.build.format(**values) for name, rule in profile.genai.options.items() if rule.build is not None}

    def report(self) -> dict:
        """The fuse report's `lengths`."""
        return {"max_length": self.max_length, "prefill": self.prefill, "token": self.token, "chunk_size": self.chunk_size,
                "chunked": self.chunked, "max_prompt_length": self.max_prompt, "npu_seq": self.npu_seq,
                "max_length_pow2": pow2_floor(self.known_max_length())}

    # ---- built from a package's files

    @classmethod
    def from_configs(cls, genai, rai_config, prefill=(), token=()) -> "NpuSettings":
        """The settings genai_config.json and rai_config.json give (ints where they are set; a
        mistyped value reads as None, the schema checks report it), with the compiled tiers."""
        search, model = table(genai, "search"), table(genai, "model")
        opts, _ = ryzenai_options(genai)
        mpl = table(rai_config, "max_prompt_length")
        return cls(max_length=as_count(search.get("max_length")), chunk_size=as_count(search.get("chunk_size")),
                   context_length=as_count(model.get("context_length")), kv_cache=as_count(opts.get("max_length_for_kv_cache")),
                   npu_seq=as_count(opts.get("hybrid_opt_max_seq_length")), chunked=str(opts.get("hybrid_opt_chunk_context", "0")) == "1",
                   max_prompt={v: n for v, n in ((v, as_count(n)) for v, n in mpl.items()) if n is not None},
                   prefill=sorted(prefill), token=sorted(token))

    @classmethod
    def from_package(cls, pkg, profile: Profile, *, genai=None, rai_config=None) -> "NpuSettings":
        genai = pkg.try_json("genai_config.json") if genai is None else genai
        rai_config = pkg.try_json("rai_config.json") if rai_config is None else rai_config
        return cls.from_configs(genai, rai_config, compiled_tiers(pkg, profile, "prefill"), compiled_tiers(pkg, profile, "token"))

    def as_dict(self) -> dict:
        """The length settings as the checks and `raipack inspect` name them."""
        return {"max_length": self.max_length, "chunk_size": self.chunk_size, "context_length": self.context_length,
                "kv_cache": self.kv_cache, "npu_seq": self.npu_seq, "chunked": self.chunked, "max_prompt": dict(self.max_prompt)}

    # ---- what the settings imply

    def one_pass(self) -> int | None:
        """The longest prompt one NPU pass takes: the chunk, else the NPU sequence length."""
        return self.chunk_size or self.npu_seq

    def longest_prompt(self) -> int | None:
        """The longest prompt the settings let through (rai_config, else max_length)."""
        return max(self.max_prompt.values(), default=None) or self.max_length

    def single_pass(self) -> int | None:
        """The longest prompt the settings take: the chunk with chunked prefill, else the NPU
        sequence length or max_length, whichever is smaller."""
        if self.chunked and self.chunk_size:
            return self.chunk_size
        return min((n for n in (self.max_length, self.npu_seq) if n), default=None)

    def prompt_limit(self, profile: Profile, version: str) -> tuple[int, str] | None:
        """(max prompt tokens for `version`, source): rai_config.json, else the profile."""
        key = version_key(self.max_prompt, version)
        if key:
            return self.max_prompt[key], f"rai_config.json max_prompt_length[{key}]"
        table = profile.max_prompt_length
        key = version_key(table, version)
        return (table[key], f"the Ryzen AI {key} limit in profile {profile.id}") if key else None

    def tier_rows(self) -> list[dict]:
        """One row per length setting: which compiled tier serves it and the padding.

        Prefill tiers serve prompts (rai_config max_prompt_length) and chunks;
        token tiers serve search.max_length."""
        by_value: dict[int, list[str]] = {}
        for v, n in sorted(self.max_prompt.items(), key=lambda kv: version_tuple(kv[0])):
            by_value.setdefault(n, []).append(v)
        settings = [("prefill", f"max_prompt_length[{vs[0]}{'…' + vs[-1] if len(vs) > 1 else ''}]", n, "rai_config.json", f"/max_prompt_length/{vs[0]}") for n, vs in by_value.items()]
        if self.chunk_size:
            settings.append(("prefill", "search.chunk_size", self.chunk_size, "genai_config.json", "/search/chunk_size"))
        if self.max_length:
            settings.append(("token", "search.max_length", self.max_length, "genai_config.json", "/search/max_length"))
        rows = []
        for phase, name, value, file, pointer in settings:
            ts = self.prefill if phase == "prefill" else self.token
            below = max((t for t in ts if t < value), default=None)
            tier = min((t for t in ts if t >= value), default=None)
            rows.append({"phase": phase, "setting": name, "value": value, "tier_below": below, "tier": tier,
                         "padding": tier - value if tier else None, "file": file, "pointer": pointer})
        return rows


def _chunked(opts: Mapping[str, OptionRule], need_chunks: bool) -> bool:
    """Whether a package built under the profile's options runs prompts in chunks."""
    cc = opts.get("hybrid_opt_chunk_context", OptionRule())
    allowed = cc.allowed or ("0", "1")
    if cc.required and allowed == ("1",):
        return True
    return need_chunks and "1" in allowed and "hybrid_opt_chunk_context" in opts


def tierless(profile: Profile) -> bool:
    """A layout compiled for no sequence-length tiers (the hybrid packages: decode runs on the iGPU)."""
    return profile.tierless


def compiled_tiers(pkg, profile: Profile, phase: str) -> list[int]:
    """Tiers the package is compiled for: its tier files (tiered layouts), else the profile's list."""

    if profile.metastate.tiered:
        found = tiers_present(pkg)["Prefill" if phase == "prefill" else "Token"]
        if found:
            return sorted(set.intersection(*found.values()))
    return list(profile.buckets.of(phase))


# -- Ryzen AI versions ---------------------------------------------------------

def sdk_version(profile: Profile, stated: str | None = None) -> tuple[str, str]:
    """(version, where it came from): stated, else $RAIPACK_SDK_VERSION, else the installed one
    ($RYZEN_AI_INSTALLATION_PATH), else the release of `profile`."""
    if stated:
        return stated, "stated"
    if os.environ.get(SDK_ENV):
        return os.environ[SDK_ENV], f"stated in ${SDK_ENV}"
    installed = installed_sdk_version()
    if installed:
        return installed, f"installed (${INSTALL_ENV})"
    return profile.release, f"the release of profile {profile.id}"


def version_key(table: Mapping, version: str) -> str | None:
    """The key of `table` for `version`: exact, else the newest x.y.z of an x.y."""
    if version in table:
        return version
    matches = [k for k in table if k.startswith(version + ".")]
    return max(matches, key=version_tuple) if matches else None


def version_tuple(v: str):
    return tuple(int(p) if p.isdigit() else 0 for p in v.split("."))


def minimum_version(table: dict, tokens: int) -> str | None:
    fits = [v for v, n in table.items() if isinstance(n, int) and n >= tokens]
    return min(fits, key=version_tuple) if fits else None
