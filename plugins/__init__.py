"""Custom kernels and their TensorRT / torch wrappers (ships as trtllm_dflash.plugins)."""
