"""ONNX Runtime model packages (docs/model_package.md): one model's builds as the variants of one
package (assemble.py), checked variant by variant (check.py), resolved for this machine into the
flat folder onnxruntime-genai 0.18 loads (resolve.py). layout.py is the format itself."""
