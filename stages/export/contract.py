"""The export stage's names for the ONNX contract readers (pipeline/npu/contract.py, external_data.py) and the Quark
config readers (pipeline/npu/quark_config.py). The export's output is checked by the build runner
with `raipack validate`'s checks (profile `oga-export`), like every stage's."""

from __future__ import annotations

from raipack.npu.contract import io_contract, matmulnbits_agreement  # noqa: F401  (re-exported for the stage and its tests)
from raipack.npu.external_data import external_data_refs  # noqa: F401
from raipack.npu.quark_config import hf_to_node, is_excluded, layer_weight_spec, node_to_hf  # noqa: F401
