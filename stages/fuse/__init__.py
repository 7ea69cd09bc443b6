"""Fuse stage: an onnxruntime-genai int4 export → a Ryzen AI NPU package layout.

Two backends share one interface (`stage.py` picks one): `ryzenai-sdk` (`sdk.py`) calls AMD's closed
`model_generate` where it exists; `reference` is raipack's open implementation: `reference.fuse`
writes the package and `graph/` holds the pattern rewrite. The binary formats it writes (model.bin /
model.pb.bin, metastate plans, cache descriptors) are coded in pipeline/npu/formats.py and described
in docs/formats.md; pipeline/runtime/reference.py runs a fused package on the CPU the way the NPU
runtime would. Where this stage sits among the layers: docs/architecture.md.
Heavy imports (onnx, onnxruntime, numpy) happen inside the functions that need them.
"""
