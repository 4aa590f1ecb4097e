"""FP8 and NVFP4 weight formats, quantize and dequantize, exactly, in plain torch on any device.

These are the tensors TensorRT-LLM loads and the checks' oracle: tests prove they equal
ModelOpt's own export of the same weight, byte for byte (tests/quantize/test_formats.py).

FP8 (Hopper and Blackwell): E4M3 values (max 448), one FP32 scale per tensor.
    scale       = amax / 448
    q           = e4m3(clamp(w / scale, -448, 448))          round to nearest even
    w'          = q * scale
  Where w / scale is rounded first matters for bf16 / fp16 weights, and ModelOpt's two exports
  differ: its HF export divides by a 0-dim FP32 scale, which PyTorch computes in the weight's
  dtype (two roundings: to bf16, then to E4M3); its TensorRT-LLM export divides by a [1]-shaped
  scale, which promotes to FP32 (one rounding). `fp32_quotient` selects the second; each
  choice reproduces the corresponding export byte for byte.

NVFP4 (Blackwell): E2M1 values {0, 0.5, 1, 1.5, 2, 3, 4, 6} with a sign, one E4M3 scale per
16 consecutive elements of the last (input) axis, one FP32 global scale per tensor.
    global      = amax / (6 * 448)
    block_scale = e4m3(clamp(block_amax / (6 * global), 2**-9, 448))      an all-zero block: 1.0
    q           = e2m1(w / (block_scale * global))   computed in FP32, round to nearest even,
                                                      saturating at 6
    packed      = q[2i] | q[2i+1] << 4                element 2i in the low nibble, uint8 [..., K/2]
    w'          = q * (block_scale * global)
  A 4-bit code is sign << 3 | index into the magnitude grid; -0.0 gets the sign bit only when
  the input is negative (a negative value that rounds to zero keeps its sign bit).

Activations get a static per-tensor FP32 `input_scale` from the calibrated amax:
    FP8: act_amax / 448            NVFP4: act_amax / (6 * 448) (the per-16 block scales of
                                   activations are computed at run time by the GEMM kernel)

Error bounds (asserted by the tests, per element):
    FP8    |w - w'| <= (2**-4 + u * (1 + 2**-4)) * |w| + 2**-10 * scale
           2**-4 is half the E4M3 spacing relative to a normal value (3 mantissa bits),
           2**-10 * scale is half the subnormal spacing (2**-9), u the unit roundoff of the
           weight's dtype for the first rounding (0 for fp32 or fp32_quotient, 2**-8 bf16,
           2**-11 fp16).
    NVFP4  |w - w'| <= s * max(1/4, |x| / 4, |x| - 6)    with s = block_scale * global, x = w / s
           on the grid the spacing is 0.5 below 2, 1 in [2, 4), 2 in [4, 6] (half-spacing
           <= max(1/4, |x|/4)); above 6 the value saturates (possible only when the E4M3 block
           scale rounded down, by at most 1/16 for normal scales).
Both bounds carry a relative slack of 2**-20 for the FP32 arithmetic around the rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0
NVFP4_BLOCK = 16
# Smallest positive E4M3 value (a subnormal): block scales are clamped up to it so a tiny
# block never gets a zero scale.
E4M3_MIN_SUBNORMAL = 2.0**-9

# The magnitude grid of E2M1 (index = the low 3 bits of a code) and the rounding boundaries
# between neighbours.
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)

_UNIT_ROUNDOFF = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
_SLACK = 1 + 2.0**-20


def _fp32_scalar(x: torch.Tensor | float) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.float32).reshape(())


# ----------------------------------------------------------------------------- FP8


def fp8_scale(amax: torch.Tensor | float) -> torch.Tensor:
    """Per-tensor FP8 scale (weights and activations alike): amax / 448, FP32, 0-dim."""
    return _fp32_scalar(amax) / E4M3_MAX


@dataclass(frozen=True)
class FP8Tensor:
    data: torch.Tensor  # float8_e4m3fn, the weight's shape
    scale: torch.Tensor  # FP32, 0-dim

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_fp8(self.data, self.scale, dtype)


def quantize_fp8(w: torch.Tensor, scale: torch.Tensor | None = None, fp32_quotient: bool = False) -> FP8Tensor:
    """E4M3 with one scale per tensor; `scale` defaults to amax(|w|) / 448.

    fp32_quotient=False rounds w / scale to w's dtype before E4M3 (ModelOpt's HF export);
    True divides in FP32 (ModelOpt's TensorRT-LLM export). Same result for fp32 weights."""
    if scale is None:
        scale = fp8_scale(w.abs().amax())
    scale = _fp32_scalar(scale).to(w.device)
    scaled = w.float() / scale if fp32_quotient else w / scale  # a 0-dim FP32 scale keeps bf16 in bf16
    return FP8Tensor(scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale)


def dequantize_fp8(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (data.float() * _fp32_scalar(scale).to(data.device)).to(dtype)


def fp8_error_bound(w: torch.Tensor, scale: torch.Tensor, fp32_quotient: bool = False) -> torch.Tensor:
    """Per-element bound on |w - dequantize(quantize(w))| (see the module docstring)."""
    u = 0.0 if fp32_quotient else _UNIT_ROUNDOFF[w.dtype]
    return ((2.0**-4 + u * (1 + 2.0**-4)) * w.float().abs() + 2.0**-10 * _fp32_scalar(scale)) * _SLACK


# ----------------------------------------------------------------------------- NVFP4


def nvfp4_global_scale(amax: torch.Tensor | float) -> torch.Tensor:
    """Per-tensor NVFP4 scale (weights: weight_scale_2; activations: input_scale): amax / (6 * 448)."""
    return _fp32_scalar(amax) / (E2M1_MAX * E4M3_MAX)


def _blocks(w: torch.Tensor) -> torch.Tensor:
    """[..., K] -> [..., K/16, 16]."""
    if w.shape[-1] % NVFP4_BLOCK:
        raise ValueError(f"NVFP4 needs the last dimension to be a multiple of {NVFP4_BLOCK}, got shape {list(w.shape)}")
    return w.unflatten(-1, (-1, NVFP4_BLOCK))


def nvfp4_block_scales(w: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """E4M3 scale of every 16-element block of the last axis: [..., K/16]."""
    block_amax = _blocks(w).abs().amax(-1).float()  # [..., K/16]
    s = block_amax / (E2M1_MAX * _fp32_scalar(global_scale).to(w.device))
    s = torch.where(s == 0, torch.ones_like(s), s)
    return s.clamp(E4M3_MIN_SUBNORMAL, E4M3_MAX).to(torch.float8_e4m3fn)


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Round FP32 values (already divided by their scale) to 4-bit E2M1 codes, uint8 in [0, 16)."""
    mids = torch.tensor(_E2M1_MIDPOINTS, device=x.device)
    mag = x.abs()
    idx = torch.bucketize(mag, mids)  # ties land on the lower neighbour ...
    at_mid = mids[idx.clamp(max=len(_E2M1_MIDPOINTS) - 1)] == mag
    idx = idx + (at_mid & (idx % 2 == 1)).long()  # ... unless that one is odd: ties to even
    return idx.to(torch.uint8) | ((x < 0).to(torch.uint8) << 3)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes -> FP32 values."""
    grid = torch.tensor(E2M1_GRID, device=codes.device)
    mag = grid[(codes & 0x7).long()]
    return torch.where((codes & 0x8) != 0, -mag, mag)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] codes -> [..., K/2] bytes; element 2i in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes -> [..., K] codes."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2)


@dataclass(frozen=True)
class NVFP4Tensor:
    data: torch.Tensor  # uint8 [..., K/2]
    block_scale: torch.Tensor  # float8_e4m3fn [..., K/16]
    global_scale: torch.Tensor  # FP32, 0-dim

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_nvfp4(self.data, self.block_scale, self.global_scale, dtype)


def _block_step(block_scale: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """The FP32 multiplier of each block: block_scale * global, [..., K/16, 1]."""
    return (block_scale.float() * _fp32_scalar(global_scale).to(block_scale.device)).unsqueeze(-1)


def quantize_nvfp4(w: torch.Tensor, global_scale: torch.Tensor | None = None) -> NVFP4Tensor:
    """NVFP4 along the last axis; `global_scale` defaults to amax(|w|) / (6 * 448).

    Pass the global scale explicitly when tensors are fused later (q/k/v, gate/up): TensorRT-LLM
    requires one global scale for a fused GEMM, taken from the group's largest amax.
    """
    if global_scale is None:
        global_scale = nvfp4_global_scale(w.abs().amax())
    global_scale = _fp32_scalar(global_scale).to(w.device)
    block_scale = nvfp4_block_scales(w, global_scale)
    x = (_blocks(w) / _block_step(block_scale, global_scale)).flatten(-2)  # FP32 [..., K]
    return NVFP4Tensor(pack_nibbles(e2m1_codes(x)), block_scale, global_scale)


def dequantize_nvfp4(
    data: torch.Tensor, block_scale: torch.Tensor, global_scale: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    values = _blocks(e2m1_values(unpack_nibbles(data)))  # [..., K/16, 16]
    return (values * _block_step(block_scale, global_scale)).flatten(-2).to(dtype)


def nvfp4_error_bound(w: torch.Tensor, block_scale: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """Per-element bound on |w - dequantize(quantize(w))| (see the module docstring)."""
    s = _block_step(block_scale, global_scale)  # [..., K/16, 1]
    x = (_blocks(w.float()) / s).abs()
    per_unit = torch.maximum(torch.maximum(torch.full_like(x, 0.25), x / 4), x - E2M1_MAX)
    return (per_unit * s).flatten(-2) * _SLACK
