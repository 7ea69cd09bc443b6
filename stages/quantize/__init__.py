"""Quantize stage building blocks: Quark weight-only UINT4 (AWQ / GPTQ / RTN) and calibration data."""
