"""trtllm_dflash: deploy DFlash speculative decoding on NVIDIA GPUs.

Kept import-light: the CLI and recipe checks must start fast, so nothing heavy
(torch, transformers) is imported here.
"""

__version__ = "0.1.0"
