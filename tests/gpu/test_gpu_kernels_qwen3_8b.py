"""The KV-injection kernels compiled on the GPU at Qwen3-8B drafter shapes (z-lab Qwen3-8B-DFlash:
32 query heads, 8 KV heads, head dim 128, blocks of 16), against the torch reference (float32
math) on the same tensors: bf16 and an FP8 (e4m3, per-KV-head scales) context cache, full and
sliding-window layers, ragged cache lengths up to 16K; the append kernel likewise."""

import pytest
import torch

from trtllm_dflash.plugins.kv_inject_attention import (
    append_context,
    append_context_reference,
    kv_inject_attention,
    kv_inject_attention_reference,
)

pytestmark = pytest.mark.gpu

HQ, HKV, D, T = 32, 8, 128, 16


def problem(lens, s_max, *, fp8=False, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    B = len(lens)
    rnd = lambda *shape: torch.randn(*shape, generator=g, device="cuda")  # noqa: E731
    q, kb, vb = rnd(B, T, HQ, D).bfloat16(), rnd(B, T, HKV, D).bfloat16(), rnd(B, T, HKV, D).bfloat16()
    kc, vc = rnd(B, s_max, HKV, D), rnd(B, s_max, HKV, D)
    scales = {}
    if fp8:
        k_scale, v_scale = kc.abs().amax((0, 1, 3)) / 448, vc.abs().amax((0, 1, 3)) / 448  # per KV head
        kc = (kc / k_scale[:, None]).to(torch.float8_e4m3fn)
        vc = (vc / v_scale[:, None]).to(torch.float8_e4m3fn)
        scales = dict(k_scale=k_scale.float(), v_scale=v_scale.float())
    else:
        kc, vc = kc.bfloat16(), vc.bfloat16()
    for cache in (kc, vc):  # rows past cache_lens are never read: make them NaN
        for b, n in enumerate(lens):
            if fp8:
                cache.view(torch.uint8)[b, n:] = 0x7F  # e4m3 NaN
            else:
                cache[b, n:] = float("nan")
    return (q, kb, vb, kc, vc, torch.tensor(lens, dtype=torch.int32, device="cuda")), scales


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-cache", "fp8-cache"])
@pytest.mark.parametrize("lens,s_max", [([1024], 1024), ([4096, 17, 0, 3000], 4096), ([16384], 16384)],
                         ids=["1x1K", "4-ragged-4K", "1x16K"])
def test_attention_kernel_at_qwen3_8b_drafter_shapes(fp8, lens, s_max):
    args, scales = problem(lens, s_max, fp8=fp8)
    out = kv_inject_attention(*args, **scales)  # CUDA: the Triton kernel
    expected = kv_inject_attention_reference(*args, **scales)
    assert out.dtype == torch.bfloat16 and not torch.isnan(out).any()
    # bf16 operands and probabilities into fp32 accumulators vs. float32 math: a few bf16 ulps
    torch.testing.assert_close(out.float(), expected.float(), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-cache", "fp8-cache"])
def test_sliding_window_layer(fp8):
    args, scales = problem([5000, 2047, 2048], 5000, fp8=fp8, seed=1)
    out = kv_inject_attention(*args, causal_block=True, window=2048, **scales)
    expected = kv_inject_attention_reference(*args, causal_block=True, window=2048, **scales)
    torch.testing.assert_close(out.float(), expected.float(), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-cache", "fp8-cache"])
def test_append_kernel_at_qwen3_8b_drafter_shapes(fp8):
    g = torch.Generator(device="cuda").manual_seed(2)
    B, S, N = 4, 4096, 300
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    k_cache = torch.zeros(B, S, HKV, D, device="cuda").to(dtype)
    v_cache = torch.zeros_like(k_cache)
    lens = torch.tensor([0, 100, 4096 - 300, 7], dtype=torch.int32, device="cuda")
    new_lens = torch.tensor([300, 16, 300, 1], dtype=torch.int32, device="cuda")
    k_new, v_new = (torch.randn(B, N, HKV, D, generator=g, device="cuda").bfloat16() for _ in range(2))
    scales = dict(k_scale=torch.full((HKV,), 0.01, device="cuda"), v_scale=torch.full((HKV,), 0.02, device="cuda")) \
        if fp8 else {}
    expected = [k_cache.clone(), v_cache.clone(), lens.clone()]
    append_context_reference(*expected[:2], k_new, v_new, expected[2], new_lens, **scales)
    append_context(k_cache, v_cache, k_new, v_new, lens, new_lens, **scales)  # CUDA: the Triton kernel
    assert torch.equal(lens, expected[2])
    for got, ref in ((k_cache, expected[0]), (v_cache, expected[1])):
        assert torch.equal(got.view(torch.uint8) if fp8 else got, ref.view(torch.uint8) if fp8 else ref)
