"""Export stage: a Quark export → an onnxruntime-genai model folder.

`builder.export` runs the onnxruntime-genai model builder through its Python API and keeps what Quark
decided (group size, bits, zero points, layers left in float). `contract` holds the pure checks on
the result (graph I/O against genai_config.json, MatMulNBits agreement with Quark, external data
references, tokenizer and chat template). `parity` compares the exported graph with the Quark model
reloaded in transformers.
"""
