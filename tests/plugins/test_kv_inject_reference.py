"""The pure-torch KV-injection attention (the oracle) against a per-query float64 loop.

Runs without triton. Tolerance: the reference computes in float32, the loop in float64;
with D <= 128 and a few hundred keys the float32 rounding stays well below 1e-5.
"""

import pytest
import torch

from kv_inject_cases import Case, attention_by_loops, make_tensors, random_case
from trtllm_dflash.plugins.kv_inject_attention.reference import (
    append_context_reference,
    dequantize_cache,
    kv_inject_attention_reference,
    quantize_to_cache,
)

ATOL = RTOL = 1e-5  # float32 reference vs float64 loops


@pytest.mark.parametrize("seed", range(12))
def test_reference_matches_loops(seed):
    gen = torch.Generator().manual_seed(seed)
    case = random_case(gen, max_len=40, head_dims=(16, 64))
    args = make_tensors(case, torch.float32, gen)
    out = kv_inject_attention_reference(*args, causal_block=case.causal_block, window=case.window)
    expected = attention_by_loops(*args, causal_block=case.causal_block, window=case.window)
    assert out.dtype == torch.float32 and out.shape == args[0].shape
    torch.testing.assert_close(out.double(), expected, atol=ATOL, rtol=RTOL, msg=lambda m: f"{case}\n{m}")


def test_reference_explicit_scale_and_window_one():
    # window=1 limits how far *back* a query sees (itself only); with causal_block it sees nothing
    # ahead either, so out[b, t, h] = v_block[b, t, h // G] exactly.
    gen = torch.Generator().manual_seed(0)
    case = Case(cache_lens=[5, 0], block_len=4, num_q_heads=4, num_kv_heads=2, head_dim=16, max_cache_len=7)
    q, kb, vb, kc, vc, lens = make_tensors(case, torch.float32, gen)
    out = kv_inject_attention_reference(q, kb, vb, kc, vc, lens, scale=0.3, causal_block=True, window=1)
    torch.testing.assert_close(out, vb.repeat_interleave(2, dim=2), atol=0, rtol=0)
    out = kv_inject_attention_reference(q, kb, vb, kc, vc, lens, scale=0.3)
    torch.testing.assert_close(out.double(), attention_by_loops(q, kb, vb, kc, vc, lens, scale=0.3),
                               atol=ATOL, rtol=RTOL)


def test_reference_fp8_cache_equals_dequantized_cache():
    gen = torch.Generator().manual_seed(1)
    case = Case(cache_lens=[9, 3], block_len=3, num_q_heads=4, num_kv_heads=2, head_dim=16, max_cache_len=10)
    q, kb, vb, kc, vc, lens = make_tensors(case, torch.float16, gen, poison_cache_tail=False)
    for k_scale, v_scale in [(torch.tensor([0.02]), torch.tensor(0.03)),
                             (torch.tensor([0.01, 0.05]), torch.tensor([0.04, 0.02]))]:
        kc8, vc8 = quantize_to_cache(kc, k_scale), quantize_to_cache(vc, v_scale)
        out = kv_inject_attention_reference(q, kb, vb, kc8, vc8, lens, k_scale=k_scale, v_scale=v_scale)
        # Same problem with the cache already dequantized (float32 everything): must agree to fp16 output rounding.
        dq = kv_inject_attention_reference(q.float(), kb.float(), vb.float(), dequantize_cache(kc8, k_scale),
                                           dequantize_cache(vc8, v_scale), lens)
        torch.testing.assert_close(out, dq.half(), atol=0, rtol=0)
        loops = attention_by_loops(q, kb, vb, kc8.float(), vc8.float(), lens, k_scale=k_scale, v_scale=v_scale)
        torch.testing.assert_close(out.double(), loops, atol=2e-3, rtol=2e-3)  # fp16 output rounding


def test_quantize_saturates_and_roundtrips():
    x = torch.tensor([0.0, 1.0, -3.5, 1e6, -1e6]).reshape(1, 5, 1, 1)
    scale = torch.tensor([0.5])
    q8 = quantize_to_cache(x, scale)
    assert q8.dtype == torch.float8_e4m3fn
    back = dequantize_cache(q8, scale).reshape(-1)
    torch.testing.assert_close(back, torch.tensor([0.0, 1.0, -3.5, 224.0, -224.0]), atol=0, rtol=0)


def test_append_then_attend_equals_full_context():
    """Growing the cache with append_context gives the same attention as writing it at once."""
    gen = torch.Generator().manual_seed(2)
    B, S, Hkv, D = 2, 12, 2, 16
    full_k, full_v = torch.randn(B, S, Hkv, D, generator=gen), torch.randn(B, S, Hkv, D, generator=gen)
    k_cache = torch.full((B, S, Hkv, D), float("nan"))
    v_cache = torch.full((B, S, Hkv, D), float("nan"))
    lens = torch.zeros(B, dtype=torch.int32)
    steps = [[3, 0], [0, 5], [4, 2], [1, 0]]  # ragged appends, including empty ones
    for news in steps:
        n_max = max(news) + 1  # k_new rows past new_lens are padding and must not be written
        k_new = torch.full((B, n_max, Hkv, D), float("inf"))
        v_new = torch.full((B, n_max, Hkv, D), float("inf"))
        for b, n in enumerate(news):
            k_new[b, :n] = full_k[b, lens[b]:lens[b] + n]
            v_new[b, :n] = full_v[b, lens[b]:lens[b] + n]
        append_context_reference(k_cache, v_cache, k_new, v_new, lens, torch.tensor(news, dtype=torch.int32))
    assert lens.tolist() == [8, 7]
    for b in range(B):
        n = int(lens[b])
        torch.testing.assert_close(k_cache[b, :n], full_k[b, :n], atol=0, rtol=0)
        torch.testing.assert_close(v_cache[b, :n], full_v[b, :n], atol=0, rtol=0)
        assert torch.isnan(k_cache[b, n:]).all() and torch.isnan(v_cache[b, n:]).all()
    q, kb, vb = (torch.randn(B, 3, 4, D, generator=gen), torch.randn(B, 3, Hkv, D, generator=gen),
                 torch.randn(B, 3, Hkv, D, generator=gen))
    out = kv_inject_attention_reference(q, kb, vb, k_cache, v_cache, lens)
    expected = attention_by_loops(q, kb, vb, full_k, full_v, lens)
    torch.testing.assert_close(out.double(), expected, atol=ATOL, rtol=RTOL)


def test_append_quantizes_into_fp8_cache():
    gen = torch.Generator().manual_seed(3)
    k_cache = torch.zeros(1, 4, 2, 16, dtype=torch.float8_e4m3fn)
    v_cache = torch.zeros(1, 4, 2, 16, dtype=torch.float8_e4m3fn)
    k_new, v_new = torch.randn(1, 2, 2, 16, generator=gen), torch.randn(1, 2, 2, 16, generator=gen)
    k_scale, v_scale = torch.tensor([0.01, 0.02]), torch.tensor([0.03, 0.04])
    lens = torch.tensor([1], dtype=torch.int32)
    append_context_reference(k_cache, v_cache, k_new, v_new, lens, torch.tensor([2], dtype=torch.int32),
                             k_scale=k_scale, v_scale=v_scale)
    assert lens.tolist() == [3]
    torch.testing.assert_close(k_cache[:, 1:3].float(), quantize_to_cache(k_new, k_scale).float(), atol=0, rtol=0)
    torch.testing.assert_close(v_cache[:, 1:3].float(), quantize_to_cache(v_new, v_scale).float(), atol=0, rtol=0)
    assert (k_cache[:, 0].float() == 0).all() and (k_cache[:, 3].float() == 0).all()
    # e4m3 keeps 3 mantissa bits: relative error of the dequantized values is at most 2^-4.
    back = dequantize_cache(k_cache[:, 1:3], k_scale)
    assert ((back - k_new).abs() <= k_new.abs() * 2 ** -4 + 1e-6).all()
