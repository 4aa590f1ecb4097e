"""The torch custom ops: CPU dispatch to the reference, fake/meta impls, opcheck, torch.compile."""

import pytest
import torch

from kv_inject_cases import Case, make_tensors
from trtllm_dflash.plugins.kv_inject_attention import (
    KVInjectArgumentError,
    append_context,
    append_context_reference,
    kv_inject_attention,
    kv_inject_attention_reference,
)

CASE = Case(cache_lens=[7, 0], block_len=4, num_q_heads=4, num_kv_heads=2, head_dim=16, max_cache_len=9,
            causal_block=True, window=6)


def tensors(dtype=torch.float32, seed=0, poison=True):
    return make_tensors(CASE, dtype, torch.Generator().manual_seed(seed), poison_cache_tail=poison)


def test_cpu_op_is_the_reference():
    args = tensors()
    out = kv_inject_attention(*args, causal_block=True, window=6, scale=0.3)
    assert torch.equal(out, kv_inject_attention_reference(*args, causal_block=True, window=6, scale=0.3))
    assert not torch.isnan(out).any()


def test_cpu_append_op_mutates_in_place():
    k_cache = torch.zeros(2, 6, 2, 16)
    v_cache = torch.zeros(2, 6, 2, 16)
    lens = torch.tensor([1, 2], dtype=torch.int32)
    k_new, v_new = torch.ones(2, 3, 2, 16), torch.full((2, 3, 2, 16), 2.0)
    expected = [t.clone() for t in (k_cache, v_cache, lens)]
    append_context_reference(*expected[:2], k_new, v_new, expected[2], torch.tensor([3, 1], dtype=torch.int32))
    append_context(k_cache, v_cache, k_new, v_new, lens, torch.tensor([3, 1], dtype=torch.int32))
    assert lens.tolist() == [4, 3]
    assert torch.equal(k_cache, expected[0]) and torch.equal(v_cache, expected[1])


def test_opcheck():
    """Schema, fake-tensor and dispatch consistency, as torch.library defines them."""
    args = tensors(poison=False)
    torch.library.opcheck(torch.ops.trtllm_dflash.kv_inject_attention.default,
                          (*args, None, True, 6, None, None))
    k_cache, v_cache = torch.zeros(2, 6, 2, 16), torch.zeros(2, 6, 2, 16)
    torch.library.opcheck(torch.ops.trtllm_dflash.append_context.default,
                          (k_cache, v_cache, torch.ones(2, 3, 2, 16), torch.ones(2, 3, 2, 16),
                           torch.tensor([1, 2], dtype=torch.int32), torch.tensor([3, 1], dtype=torch.int32),
                           None, None))


def test_meta_device_infers_and_checks():
    args = [t.to("meta") for t in tensors()]
    out = kv_inject_attention(*args)
    assert out.device.type == "meta" and out.shape == args[0].shape and out.dtype == args[0].dtype
    with pytest.raises(KVInjectArgumentError, match="v_block"):
        kv_inject_attention(args[0], args[1], args[2][:, :, :, :8], *args[3:])
    with pytest.raises(KVInjectArgumentError, match="window"):
        kv_inject_attention(*args, window=0)


def test_torch_compile_traces_through_the_fake_impl():
    args = tensors()

    def layer(q, kb, vb, kc, vc, lens):
        return kv_inject_attention(q * 2, kb, vb, kc, vc, lens, causal_block=True, window=6) + 1

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(*args), layer(*args), atol=0, rtol=0)
