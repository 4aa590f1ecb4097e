"""Quantization: exact FP8 / NVFP4 formats (formats/quant.py), calibration (quantize.py, calibrate.py),\nweight-only emulation (emulate.py) and the `quantize` stage (stage.py)."""
