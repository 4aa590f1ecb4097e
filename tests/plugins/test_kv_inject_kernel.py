"""The Triton kernels against the torch reference (CPU: TRITON_INTERPRET=1, see conftest.py).

Outputs are pre-filled with NaN and cache rows past cache_lens hold NaN, so an element
the kernel forgets to write, or a cache row it wrongly reads, fails the comparison.

Tolerances (kernel vs the float32 reference):
- fp32: 1e-5 abs/rel: both accumulate in fp32, only the summation order differs.
- fp16: 2e-3 abs/rel: the output is rounded to fp16 (half an ulp is 4.9e-4 at |x| ~ 1),
  and under the interpreter fp16 `tl.dot` products round to fp16 before accumulating.
- bf16: 1.6e-2 (two bf16 ulps): tiles are upcast to fp32 under the interpreter (its bf16
  arithmetic is broken), but its fp32 -> bf16 store truncates instead of rounding.
"""

import pytest
import torch

from kv_inject_cases import Case, make_tensors, random_case
from trtllm_dflash.plugins.kv_inject_attention.checks import KVInjectArgumentError
from trtllm_dflash.plugins.kv_inject_attention.reference import (
    append_context_reference,
    kv_inject_attention_reference,
    quantize_to_cache,
)

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def check_case(kernel, case: Case, dtype, gen, device, **extra):
    args = [t.to(device) for t in make_tensors(case, dtype, gen)]
    options = dict(scale=case.scale, causal_block=case.causal_block, window=case.window, **extra)
    out = torch.full_like(args[0], float("nan"))
    kernel.kv_inject_attention_triton(*args, out=out, **options)
    expected = kv_inject_attention_reference(*[t.cpu() for t in args], **options)
    tol = TOL[dtype]
    torch.testing.assert_close(out.cpu().float(), expected.float(), atol=tol, rtol=tol,
                               msg=lambda m: f"{case} {dtype}\n{m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("seed", range(30))
def test_kernel_matches_reference_random(kernel, device, seed, dtype):
    """Random shapes: ragged cache lengths 0..160, T 1..16, GQA 1..8, D 64/128, causal and window on/off."""
    gen = torch.Generator().manual_seed(seed)
    check_case(kernel, random_case(gen, max_len=160), dtype, gen, device)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("seed", range(1000, 1200))
def test_kernel_matches_reference_sweep(kernel, device, seed, dtype):
    """The larger sweep: cache lengths 0..2048, up to 4 sequences and 4 KV heads."""
    gen = torch.Generator().manual_seed(seed)
    check_case(kernel, random_case(gen, max_len=2048, max_batch=4, max_kv_heads=4), dtype, gen, device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal_block,window", [(False, None), (True, 700)])
def test_kernel_long_ragged_cache(kernel, device, dtype, head_dim, causal_block, window):
    """Cache lengths 2048 / 0 / odd in one batch (many tiles, an empty cache, a partial last tile)."""
    gen = torch.Generator().manual_seed(head_dim)
    case = Case(cache_lens=[2048, 0, 777], block_len=16, num_q_heads=2, num_kv_heads=1, head_dim=head_dim,
                max_cache_len=2048, causal_block=causal_block, window=window)
    check_case(kernel, case, dtype, gen, device)


@pytest.mark.parametrize("window", [200, 201, 137, 138, 73, 74, 9])
def test_kernel_window_edges_at_tile_boundaries(kernel, device, window):
    """The oldest visible cache entry (200 - window + 1) just before / at a 64-key tile boundary."""
    gen = torch.Generator().manual_seed(window)
    case = Case(cache_lens=[200], block_len=4, num_q_heads=1, num_kv_heads=1, head_dim=64, max_cache_len=200,
                window=window)
    check_case(kernel, case, torch.float32, gen, device)


def test_kernel_many_query_rows(kernel, device):
    """T * GROUP = 160 rows > BLOCK_M = 128: two programs per KV head, the second starting mid-block."""
    gen = torch.Generator().manual_seed(8)
    for causal_block, window in [(False, None), (True, 50)]:
        case = Case(cache_lens=[90, 20], block_len=40, num_q_heads=8, num_kv_heads=2, head_dim=32,
                    max_cache_len=90, causal_block=causal_block, window=window)
        check_case(kernel, case, torch.float32, gen, device)


@pytest.mark.parametrize("head_dim", [16, 32])
def test_kernel_small_head_dims(kernel, device, head_dim):
    gen = torch.Generator().manual_seed(7)
    case = Case(cache_lens=[5, 70], block_len=8, num_q_heads=4, num_kv_heads=2, head_dim=head_dim,
                max_cache_len=72, causal_block=True, window=40, scale=0.2)
    check_case(kernel, case, torch.float32, gen, device)


def test_kernel_bf16(kernel, device):
    gen = torch.Generator().manual_seed(11)
    case = Case(cache_lens=[100, 3], block_len=16, num_q_heads=8, num_kv_heads=2, head_dim=64, max_cache_len=100)
    check_case(kernel, case, torch.bfloat16, gen, device)


@pytest.mark.parametrize("per_head", [False, True])
def test_kernel_fp8_cache(kernel, device, per_head):
    """float8_e4m3fn cache dequantized in the kernel (the interpreter loads fp8 correctly)."""
    gen = torch.Generator().manual_seed(5)
    case = Case(cache_lens=[150, 0, 64], block_len=16, num_q_heads=4, num_kv_heads=2, head_dim=64,
                max_cache_len=150, causal_block=True)
    q, kb, vb, kc, vc, lens = make_tensors(case, torch.float16, gen, poison_cache_tail=False)
    k_scale = torch.tensor([0.01, 0.03] if per_head else [0.02])
    v_scale = torch.tensor([0.02, 0.05] if per_head else [0.04])
    args = [t.to(device) for t in (q, kb, vb, quantize_to_cache(kc, k_scale), quantize_to_cache(vc, v_scale), lens)]
    scales = dict(k_scale=k_scale.to(device), v_scale=v_scale.to(device), causal_block=True)
    out = torch.full_like(args[0], float("nan"))
    kernel.kv_inject_attention_triton(*args, out=out, **scales)
    expected = kv_inject_attention_reference(*[t.cpu() for t in args], **{k: v.cpu() if torch.is_tensor(v) else v
                                                                          for k, v in scales.items()})
    torch.testing.assert_close(out.cpu(), expected, atol=TOL[torch.float16], rtol=TOL[torch.float16])


def test_kernel_strided_inputs(kernel, device):
    """Views with non-packed strides (heads sliced out of a wider tensor, a transposed batch)."""
    gen = torch.Generator().manual_seed(3)
    B, T, Hq, Hkv, D, S = 2, 5, 4, 2, 64, 40
    q = torch.randn(T, B, Hq, D, generator=gen).transpose(0, 1)  # [B, T, Hq, D], batch not outermost
    kv_block = torch.randn(B, T, 2 * Hkv, D, generator=gen)
    cache = torch.randn(B, S, 2 * Hkv, D, generator=gen)
    args = [q, kv_block[:, :, :Hkv], kv_block[:, :, Hkv:], cache[:, :, :Hkv], cache[:, :, Hkv:],
            torch.tensor([40, 17], dtype=torch.int32)]
    args = [t.to(device) for t in args]
    out = kernel.kv_inject_attention_triton(*args, window=20)
    expected = kv_inject_attention_reference(*[t.cpu() for t in args], window=20)
    torch.testing.assert_close(out.cpu(), expected, atol=TOL[torch.float32], rtol=TOL[torch.float32])


def test_kernel_rejects_before_launch(kernel, device, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    case = Case(cache_lens=[3], block_len=2, num_q_heads=2, num_kv_heads=1, head_dim=96, max_cache_len=4)
    args = [t.to(device) for t in make_tensors(case, torch.float32, gen)]
    with pytest.raises(KVInjectArgumentError, match="D = 96"):
        kernel.kv_inject_attention_triton(*args)
    case.head_dim = 64
    args = [t.to(device) for t in make_tensors(case, torch.float32, gen)]
    with pytest.raises(KVInjectArgumentError, match=r"cache_lens\[0\] = 5"):
        kernel.kv_inject_attention_triton(*args[:5], torch.tensor([5], dtype=torch.int32, device=device))
    with pytest.raises(KVInjectArgumentError, match="window"):
        kernel.kv_inject_attention_triton(*args, window=0)
    with pytest.raises(KVInjectArgumentError, match="out must be"):
        kernel.kv_inject_attention_triton(*args, out=torch.empty(1, 2, 2, 32, device=device))
    if device.type == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(KVInjectArgumentError, match="needs CUDA tensors"):
            kernel.kv_inject_attention_triton(*args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_append_kernel_matches_reference(kernel, device, dtype):
    gen = torch.Generator().manual_seed(4)
    B, S, Hkv, D, N = 3, 40, 2, 64, 20
    k_cache = torch.full((B, S, Hkv, D), float("nan"), dtype=dtype)
    v_cache = torch.full((B, S, Hkv, D), float("nan"), dtype=dtype)
    lens = torch.tensor([0, 17, 35], dtype=torch.int32)
    new_lens = torch.tensor([20, 0, 5], dtype=torch.int32)  # up to the brim of the last row
    k_new = torch.randn(B, N, Hkv, D, generator=gen).to(dtype)
    v_new = torch.randn(B, N, Hkv, D, generator=gen).to(dtype)
    ref = [t.clone() for t in (k_cache, v_cache, lens)]
    append_context_reference(ref[0], ref[1], k_new, v_new, ref[2], new_lens)
    got = [t.to(device) for t in (k_cache, v_cache, lens)]
    kernel.append_context_triton(got[0], got[1], k_new.to(device), v_new.to(device), got[2], new_lens.to(device))
    for g, r in zip(got, ref):  # a pure copy: bit-exact, untouched rows stay NaN
        assert torch.equal(g.cpu().nan_to_num(123.0), r.nan_to_num(123.0))
    assert got[2].cpu().tolist() == [20, 17, 40]
    with pytest.raises(KVInjectArgumentError, match="exceeds S_max"):
        kernel.append_context_triton(got[0], got[1], k_new.to(device), v_new.to(device), got[2], new_lens.to(device))


def test_append_kernel_quantizes_to_fp8(kernel, device):
    """Per-head scales and saturation at +-448.

    The interpreter's fp32 -> fp8 cast drops the carry when rounding overflows the mantissa
    (126.24 becomes 64, not 128; triton-lang/triton#11897), so the new values here are exact
    multiples of an fp8 value and the scale: the cast is then exact on any backend.
    """
    gen = torch.Generator().manual_seed(6)
    B, S, Hkv, D, N = 2, 12, 2, 32, 4
    k_scale, v_scale = torch.tensor([0.5, 0.25]), torch.tensor([2.0, 0.125])
    codes = torch.randn(B, N, Hkv, D, generator=gen).mul(50).to(torch.float8_e4m3fn).float()  # exact fp8 values
    k_new = (codes * k_scale.reshape(1, 1, -1, 1)).half()
    v_new = (codes * v_scale.reshape(1, 1, -1, 1)).half()
    k_new[0, 0, 0, :4] = torch.tensor([1e4, -1e4, 224.0, -300.0])  # /0.5 -> 2e4, -2e4, 448, -600: saturate
    new_lens = torch.tensor([4, 3], dtype=torch.int32)

    def empty_cache():
        z = torch.zeros(B, S, Hkv, D, dtype=torch.float8_e4m3fn)
        return z, z.clone(), torch.tensor([1, 8], dtype=torch.int32)

    rk, rv, rl = empty_cache()
    append_context_reference(rk, rv, k_new, v_new, rl, new_lens, k_scale=k_scale, v_scale=v_scale)
    kk, kv, kl = [t.to(device) for t in empty_cache()]
    kernel.append_context_triton(kk, kv, k_new.to(device), v_new.to(device), kl, new_lens.to(device),
                                 k_scale=k_scale.to(device), v_scale=v_scale.to(device))
    assert rl.tolist() == kl.cpu().tolist() == [5, 11]
    assert torch.equal(rk.float(), kk.cpu().float()) and torch.equal(rv.float(), kv.cpu().float())
    assert kk[0, 1, 0, :4].cpu().float().tolist() == [448.0, -448.0, 448.0, -448.0]
