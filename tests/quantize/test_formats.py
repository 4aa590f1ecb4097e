"""Exact FP8 / NVFP4 formats: rounding, packing, scales and the stated error bounds.

The parity with ModelOpt's own export is in test_modelopt_parity.py (needs nvidia-modelopt).
"""

import pytest
import torch

from trtllm_dflash.formats.quant import (
    E2M1_GRID,
    E4M3_MAX,
    dequantize_nvfp4,
    e2m1_codes,
    e2m1_values,
    fp8_error_bound,
    fp8_scale,
    nvfp4_block_scales,
    nvfp4_error_bound,
    nvfp4_global_scale,
    pack_nibbles,
    quantize_fp8,
    quantize_nvfp4,
    unpack_nibbles,
)


def test_e2m1_grid_values_map_to_themselves():
    grid = torch.tensor(E2M1_GRID)
    codes = e2m1_codes(torch.cat([grid, -grid[1:]]))
    assert codes.tolist() == list(range(8)) + list(range(9, 16))
    assert torch.equal(e2m1_values(codes), torch.cat([grid, -grid[1:]]))


def test_e2m1_ties_round_to_even_and_saturate():
    # midpoints between grid neighbours go to the neighbour with the even index
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert e2m1_values(e2m1_codes(mids)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    # just off the midpoints: ordinary nearest rounding
    eps = 1e-3
    assert e2m1_values(e2m1_codes(mids + eps)).tolist() == [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert e2m1_values(e2m1_codes(mids - eps)).tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    # beyond 6 saturates; a negative value that rounds to zero keeps its sign bit
    assert e2m1_values(e2m1_codes(torch.tensor([6.4, -7.0]))).tolist() == [6.0, -6.0]
    assert e2m1_codes(torch.tensor([-0.1, 0.1, -0.0])).tolist() == [8, 0, 0]


def test_nibble_packing_order_and_round_trip():
    every_byte = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(pack_nibbles(unpack_nibbles(every_byte)), every_byte)
    codes = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    assert pack_nibbles(codes).tolist() == [0x21, 0x43]  # element 2i in the low nibble


def test_nvfp4_hand_computed_block():
    # amax 6 -> global = 6 / 2688, block scale = 6 / (6 * global) = 448: the values are their own codes
    w = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -1, -1.5, -2, -3, -4, -6, 0])[None]
    q = quantize_nvfp4(w)
    assert q.global_scale.item() == pytest.approx(6 / 2688, rel=1e-7)
    assert q.block_scale.float().tolist() == [[448.0]]
    # codes 0..7 then 9..15 and 0, packed pairwise with the even element low
    assert q.data.tolist() == [[0x10, 0x32, 0x54, 0x76, 0xA9, 0xCB, 0xED, 0x0F]]
    assert torch.allclose(q.dequantize(), w, rtol=1e-6, atol=0)


def test_nvfp4_block_scales_edge_cases():
    g = nvfp4_global_scale(torch.tensor(6.0 * 448))  # global = 1
    w = torch.zeros(1, 48)
    w[0, 16:32] = 1e-6  # tiny block: scale clamps up to the smallest E4M3 subnormal
    w[0, 32:48] = 6.0 * 1000  # huge block: scale clamps to 448
    s = nvfp4_block_scales(w, g).float()[0]
    assert s.tolist() == [1.0, 2.0**-9, 448.0]  # all-zero block: scale 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fp8_error_within_bound_and_bound_is_tight(dtype):
    torch.manual_seed(0)
    # normal weights plus a few large outliers, so small values land in E4M3's subnormal range
    w = torch.randn(256, 512)
    w[torch.rand_like(w) < 1e-3] *= 300
    w = w.to(dtype)
    q = quantize_fp8(w)
    assert q.data.dtype == torch.float8_e4m3fn and q.scale.dtype == torch.float32 and q.scale.dim() == 0
    assert q.scale.item() == pytest.approx(w.float().abs().max().item() / E4M3_MAX, rel=1e-7)
    err = (w.float() - q.dequantize()).abs()
    bound = fp8_error_bound(w, q.scale)
    assert bool((err <= bound).all()), f"max err/bound {(err / bound).max():.4f}"
    # the bound is attained within a factor 2 somewhere: it is not vacuous
    assert (err / bound).max() > 0.5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp8_fp32_quotient_rounds_once(dtype):
    torch.manual_seed(4)
    w = (torch.randn(128, 256) * 0.02).to(dtype)
    once, twice = quantize_fp8(w, fp32_quotient=True), quantize_fp8(w)
    assert torch.equal(once.scale, twice.scale)
    # one rounding: the nearest E4M3 value of the exact quotient
    assert torch.equal(once.data.view(torch.uint8), (w.float() / once.scale).to(torch.float8_e4m3fn).view(torch.uint8))
    # the two differ somewhere for bf16 / fp16 inputs (double rounding), never by more than one E4M3 step
    a, b = once.data.float(), twice.data.float()
    assert not torch.equal(a, b)
    err = (w.float() - once.dequantize()).abs()
    assert bool((err <= fp8_error_bound(w, once.scale, fp32_quotient=True)).all())


def test_fp8_saturates_instead_of_overflowing():
    q = quantize_fp8(torch.tensor([1.0, -1.0, 0.5]), scale=torch.tensor(1 / 1000))
    assert q.data.float().tolist() == [448.0, -448.0, 448.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_error_within_bound_and_bound_is_tight(dtype):
    torch.manual_seed(1)
    w = torch.randn(128, 256)
    w[:, :16] = 0  # an all-zero block per row
    w[:, 16:32] *= 1e-5  # blocks far below the tensor's amax: subnormal / clamped E4M3 scales
    w[torch.rand_like(w) < 2e-3] *= 50  # outliers
    w = w.to(dtype)
    q = quantize_nvfp4(w)
    assert q.data.shape == (128, 128) and q.data.dtype == torch.uint8
    assert q.block_scale.shape == (128, 16) and q.block_scale.dtype == torch.float8_e4m3fn
    assert q.global_scale.item() == pytest.approx(w.float().abs().max().item() / (6 * 448), rel=1e-7)
    deq = dequantize_nvfp4(q.data, q.block_scale, q.global_scale)
    err = (w.float() - deq).abs()
    bound = nvfp4_error_bound(w, q.block_scale, q.global_scale)
    assert bool((err <= bound).all()), f"max err/bound {(err / bound).max():.4f}"
    assert (err / bound).max() > 0.5
    assert bool((deq[:, :16] == 0).all())


def test_nvfp4_shared_global_scale_is_used():
    torch.manual_seed(2)
    small, big = torch.randn(8, 32), 10 * torch.randn(8, 32)
    g = nvfp4_global_scale(torch.maximum(small.abs().max(), big.abs().max()))
    q = quantize_nvfp4(small, g)
    assert torch.equal(q.global_scale, g)
    assert not torch.equal(q.block_scale, quantize_nvfp4(small).block_scale)
    err = (small - q.dequantize()).abs()
    assert bool((err <= nvfp4_error_bound(small, q.block_scale, g)).all())


def test_scales_of_activations():
    amax = torch.tensor(3.5)
    assert fp8_scale(amax).item() == pytest.approx(3.5 / 448, rel=1e-7)
    assert nvfp4_global_scale(amax).item() == pytest.approx(3.5 / 2688, rel=1e-7)


def test_nvfp4_refuses_a_width_not_multiple_of_16():
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_nvfp4(torch.randn(4, 24))
