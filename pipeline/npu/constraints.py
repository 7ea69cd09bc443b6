"""What the NPU requires of a graph, written once for the fuse stage and the checks (RP903):
the MatMulNBits kernels' limits, and a graph's initializers lying where model.pb.bin says."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raipack.npu.spec import Profile


@dataclass
class NpuConstraints:
    """The NPU kernels' limits on a `MatMulNBits` node (bits, group size, K/N multiples), from the profile."""

    bits: int = 4
    group_sizes: tuple[int, ...] = (128,)
    k_multiple: int = 1
    n_multiple: int = 1

    @classmethod
    def from_profile(cls, profile: Profile) -> NpuConstraints:
        q = profile.quantization
        return cls(bits=q.bits, group_sizes=q.group_sizes(), k_multiple=q.npu_k_multiple, n_multiple=q.npu_n_multiple)

    def matmul_problems(self, bits, block, K, N, extra_inputs: bool = False) -> list[str]:
        """Why a MatMulNBits node of these attributes cannot run on the NPU (empty: it can).
        `extra_inputs`: the node has g_idx or bias inputs."""
        why = []
        if bits != self.bits:
            why.append(f"bits is {bits}, the NPU kernels take {self.bits}")
        if block not in self.group_sizes:
            why.append(f"block_size (group size) is {block}, the profile allows {list(self.group_sizes)}")
        if not isinstance(K, int) or not isinstance(N, int):
            why.append("K or N attribute missing")
        else:
            if K % self.k_multiple or (isinstance(block, int) and block and K % block):
                why.append(f"K={K} is not a multiple of {self.k_multiple if K % self.k_multiple else block}")
            if N % self.n_multiple:
                why.append(f"N={N} is not a multiple of {self.n_multiple}")
        if extra_inputs:
            why.append("g_idx or bias inputs are not supported by the fused kernels")
        return why


def stored_in(graph, weights_file: str):
    """(initializer, its external data entries) for every initializer of `graph` kept in `weights_file`."""
    for t in graph.initializer:
        ext = {e.key: e.value for e in t.external_data}
        if ext.get("location") == weights_file:
            yield t, ext


def placed_as_header_says(t, ext: dict, entry: dict | None) -> bool:
    """Whether initializer `t` (external data `ext`) lies at the offset, length and shape the
    model.pb.bin entry records (False without an entry or with offsets that are not numbers)."""
    try:
        offset, length = int(ext.get("offset", 0)), int(ext.get("length", -1))
    except ValueError:
        return False
    return entry is not None and offset == entry["offset"] and length == entry["size"] and list(t.dims) == entry.get("shape")
