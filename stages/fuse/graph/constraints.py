"""The NPU kernels' limits on a `MatMulNBits` node: written once in pipeline/npu/constraints.py
(the checks read the same); here they are applied to a graph's node."""

from __future__ import annotations

from raipack.npu.constraints import NpuConstraints as Constraints
from raipack.stages.fuse.graph.model import attr

__all__ = ["Constraints", "check_matmul"]


def check_matmul(node, c: Constraints) -> list[str]:
    """Why a MatMulNBits node cannot run on the NPU under constraints `c` (empty: it can)."""
    return c.matmul_problems(attr(node, "bits", 4), attr(node, "block_size"), attr(node, "K"), attr(node, "N"),
                             extra_inputs=len(node.input) > 4 and any(node.input[4:]))
