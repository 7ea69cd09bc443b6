"""The NPU kernels' limits on a `MatMulNBits` node (bits, group size, K/N multiples), from the profile."""

from __future__ import annotations

from dataclasses import dataclass

from stages.fuse.graph.model import attr


@dataclass
class Constraints:
    bits: int = 4
    group_sizes: tuple[int, ...] = (128,)
    k_multiple: int = 1
    n_multiple: int = 1

    @classmethod
    def from_profile(cls, profile: dict) -> Constraints:
        q = profile.get("quantization") or {}
        groups = q.get("allowed_group_sizes") or [q.get("group_size", 128)]
        return cls(bits=int(q.get("bits", 4)), group_sizes=tuple(int(g) for g in groups),
                   k_multiple=int(q.get("npu_k_multiple", 1)), n_multiple=int(q.get("npu_n_multiple", 1)))


def check_matmul(node, c: Constraints) -> list[str]:
    """Why a MatMulNBits node cannot run on the NPU under constraints `c` (empty: it can)."""
    why = []
    bits, block, K, N = attr(node, "bits", 4), attr(node, "block_size"), attr(node, "K"), attr(node, "N")
    if bits != c.bits:
        why.append(f"bits is {bits}, the NPU kernels take {c.bits}")
    if block not in c.group_sizes:
        why.append(f"block_size (group size) is {block}, the profile allows {list(c.group_sizes)}")
    if K is None or N is None:
        why.append("K or N attribute missing")
    else:
        if K % c.k_multiple or (block and K % block):
            why.append(f"K={K} is not a multiple of {c.k_multiple if K % c.k_multiple else block}")
        if N % c.n_multiple:
            why.append(f"N={N} is not a multiple of {c.n_multiple}")
    if len(node.input) > 4 and any(node.input[4:]):
        why.append("g_idx or bias inputs are not supported by the fused kernels")
    return why
