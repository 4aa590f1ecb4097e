"""Weight-only emulation of FP8 / NVFP4 on a model in memory.

`fake_quantize_(model, "fp8" | "nvfp4")` replaces every linear weight (but the LM head) by
dequantize(quantize(W)) with the exact formats of formats/quant.py and the scale sharing of the
TensorRT-LLM checkpoints: layers fused into one GEMM (q/k/v, gate/up) share one amax, FP8
divides in FP32. A model treated so computes what the quantized checkpoint's weights compute;
activations and the KV cache stay in the model's precision.
"""

from __future__ import annotations

import torch
from torch import nn

from trtllm_dflash.formats import quant as F
from trtllm_dflash.quantize.calibrate import DRAFTER_SHARED_INPUT_SUFFIXES, SHARED_INPUT_SUFFIXES, shared_input_groups

SCHEMES = ("fp8", "nvfp4")


@torch.no_grad()
def fake_quantize_(model: nn.Module, scheme: str, drafter: bool = False,
                   exclude: tuple[str, ...] = ("lm_head",)) -> nn.Module:
    """In place; `drafter` selects the drafter engine's fusion groups (k/v, not q/k/v)."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r}: allowed {', '.join(SCHEMES)}")
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)
               and n.rsplit(".", 1)[-1] not in exclude}
    for group in shared_input_groups(linears, DRAFTER_SHARED_INPUT_SUFFIXES if drafter else SHARED_INPUT_SUFFIXES):
        amax = torch.stack([linears[n].weight.abs().amax().float() for n in group]).max()
        for name in group:
            w = linears[name].weight
            if scheme == "fp8":
                q = F.quantize_fp8(w, F.fp8_scale(amax), fp32_quotient=True)
            else:
                q = F.quantize_nvfp4(w, F.nvfp4_global_scale(amax))
            w.copy_(q.dequantize(w.dtype))
    return model
