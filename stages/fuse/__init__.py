"""Fuse stage: an onnxruntime-genai int4 export → a Ryzen AI NPU package layout.

Two backends share one interface (see DESIGN.md, "The token-fusion stage without AMD's closed tool"):
`ryzenai-sdk` calls AMD's closed tool where it exists; `reference` (this package) is raipack's open
implementation: `reference.fuse` writes the package, `graph` holds the pattern rewrite, `formats` the
documented binary formats (model.bin / model.pb.bin, metastate plans, cache descriptors) and
`runtime.ReferenceRuntime` executes a fused package on the CPU the way the NPU runtime would.
Heavy imports (onnx, onnxruntime, numpy) happen inside the functions that need them.
"""
