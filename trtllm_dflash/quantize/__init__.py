"""Quantization: exact FP8 / NVFP4 formats (formats/quant.py), the plan (quantize.py), calibration
(calibration.py, calibrate.py), the trtllm layout's quantized tensors (transform.py), weight-only
emulation (emulate.py) and the `quantize` stage (stage.py)."""
