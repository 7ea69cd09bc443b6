"""The smoke stage: run the package, on the NPU when one answers, else on the reference runtime."""
