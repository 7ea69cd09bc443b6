"""The export stage's names for the ONNX contract readers of pipeline/npu/contract.py. The
export's output is checked by the build runner with `raipack validate`'s checks (profile
`oga-export`), like every stage's."""

from __future__ import annotations

from pipeline.npu.contract import (  # noqa: F401  (re-exported for the stage and its tests)
    external_data_refs,
    hf_to_node,
    io_contract,
    is_excluded,
    layer_weight_spec,
    matmulnbits_agreement,
    node_to_hf,
)
