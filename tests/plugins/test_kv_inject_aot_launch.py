"""The AOT plugins' kernels launched with TensorRT's argument list (inputs, int32 args from the
aot_impl formulas, outputs), through triton's launcher: under the interpreter here, compiled on
a GPU (tests/gpu adds the PTX launched through the CUDA driver)."""

import pytest
import torch

from aot_launch import append_launch, attention_launch, torch_launch
from kv_inject_cases import Case, make_tensors
from trtllm_dflash.plugins.kv_inject_attention import append_context_reference, kv_inject_attention_reference


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "engine-dynamic"])
def test_attention_kernel_with_the_aot_argument_list(kernel, device, dynamic):
    """dynamic: B, T, S unknown at compile time, as in the drafter engine (BLOCK_M = 128 tiles)."""
    case = Case(cache_lens=[5, 0, 9], block_len=4, num_q_heads=4, num_kv_heads=2, head_dim=16, max_cache_len=11,
                causal_block=True, window=7)
    args = make_tensors(case, torch.float32, torch.Generator().manual_seed(1), poison_cache_tail=True)
    launch = attention_launch(kernel, *[t.to(device) for t in args], causal_block=True, window=7, dynamic=dynamic)
    torch_launch(kernel._kv_inject_attention_fwd, launch)
    expected = kv_inject_attention_reference(*args, causal_block=True, window=7)
    torch.testing.assert_close(launch.outputs[0].cpu(), expected, atol=1e-5, rtol=1e-5)


def _append_case(gen):
    k_cache, v_cache = torch.randn(2, 2, 10, 2, 16, generator=gen)
    lens = torch.tensor([3, 0], dtype=torch.int32)
    k_new, v_new = torch.randn(2, 2, 5, 2, 16, generator=gen)
    new_lens = torch.tensor([5, 2], dtype=torch.int32)
    return k_cache, v_cache, k_new, v_new, lens, new_lens


def test_append_kernel_in_place_with_the_aot_argument_list(kernel, device):
    """Outputs bound to the caches' memory (what the drafter runner does): only new rows change."""
    k_cache, v_cache, k_new, v_new, lens, new_lens = _append_case(torch.Generator().manual_seed(2))
    expected = [k_cache.clone(), v_cache.clone(), lens.clone()]
    append_context_reference(*expected[:2], k_new, v_new, expected[2], new_lens)
    got = [t.to(device) for t in (k_cache, v_cache, k_new, v_new, lens, new_lens)]
    launch = append_launch(kernel, *got)
    assert launch.outputs[0] is got[0] and launch.outputs[1] is got[1]
    torch_launch(kernel._append_context_aot, launch)
    assert torch.equal(got[0].cpu(), expected[0]) and torch.equal(got[1].cpu(), expected[1])
    assert launch.outputs[2].tolist() == [8, 2] and got[4].tolist() == [3, 0]  # lens_out; cache_lens untouched


def test_append_kernel_writes_only_the_new_rows(kernel, device):
    """Separate output buffers show what the kernel writes: rows [lens, lens + new_lens) only."""
    k_cache, v_cache, k_new, v_new, lens, new_lens = [t.to(device)
                                                      for t in _append_case(torch.Generator().manual_seed(3))]
    k_out, v_out = torch.full_like(k_cache, float("nan")), torch.full_like(v_cache, float("nan"))
    launch = append_launch(kernel, k_cache, v_cache, k_new, v_new, lens, new_lens, k_out=k_out, v_out=v_out)
    torch_launch(kernel._append_context_aot, launch)
    for b, (start, n) in enumerate(zip(lens.tolist(), new_lens.tolist())):
        written = ~torch.isnan(k_out[b, :, 0, 0])
        assert written.nonzero().flatten().tolist() == list(range(start, start + n))
        assert torch.equal(k_out[b, start:start + n], k_new[b, :n])
        assert torch.equal(v_out[b, start:start + n], v_new[b, :n])
