"""Quantization: exact FP8 / NVFP4 formats (formats.py) and the `quantize` stage (quantize.py)."""
