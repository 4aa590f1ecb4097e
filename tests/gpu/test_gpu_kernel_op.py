"""On CUDA the torch op dispatches to the compiled Triton kernel and matches the reference."""

import pytest
import torch

from kv_inject_cases import Case, make_tensors
from trtllm_dflash.plugins.kv_inject_attention import kv_inject_attention, kv_inject_attention_reference

CASE = Case(cache_lens=[7, 0], block_len=4, num_q_heads=4, num_kv_heads=2, head_dim=16, max_cache_len=9,
            causal_block=True, window=6)

pytestmark = pytest.mark.gpu


def test_cuda_op_runs_the_kernel(monkeypatch):
    from trtllm_dflash.plugins.kv_inject_attention import kernel

    calls = []
    launcher = kernel.kv_inject_attention_triton
    monkeypatch.setattr(kernel, "kv_inject_attention_triton", lambda *a, **k: calls.append(1) or launcher(*a, **k))
    args = make_tensors(CASE, torch.float16, torch.Generator().manual_seed(0), poison_cache_tail=True)
    out = kv_inject_attention(*[t.cuda() for t in args], causal_block=True, window=6)
    assert calls == [1]
    expected = kv_inject_attention_reference(*args, causal_block=True, window=6)
    torch.testing.assert_close(out.cpu(), expected, atol=2e-3, rtol=2e-3)  # fp16 output rounding
