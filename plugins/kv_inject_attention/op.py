"""torch custom ops: `torch.ops.trtllm_dflash.kv_inject_attention` and `.append_context`.

CUDA tensors run the Triton kernels (kernel.py, imported on first use so triton stays
optional); every other device runs the pure-torch reference. Both paths check their
arguments first (checks.py) and raise KVInjectArgumentError naming the bad one; an
unsupported kernel configuration on CUDA (say head dim 96) raises too, rather than
silently switching to the slow path: call the reference explicitly for that.

The fake (meta) implementations run the shape/dtype checks and allocate the output, so
the ops trace under torch.compile and on the meta device without running anything.
The real implementations read cache_lens on the host to reject overflowing caches,
which synchronizes a CUDA stream and cannot be captured in a CUDA graph.
"""

from typing import Optional

import torch

from . import checks, reference
from .checks import tensor_meta


def _meta(t: Optional[torch.Tensor]):
    return None if t is None else tensor_meta(t)


@torch.library.custom_op("trtllm_dflash::kv_inject_attention", mutates_args=())
def _kv_inject_attention(
    q: torch.Tensor,
    k_block: torch.Tensor,
    v_block: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    scale: Optional[float],
    causal_block: bool,
    window: Optional[int],
    k_scale: Optional[torch.Tensor],
    v_scale: Optional[torch.Tensor],
) -> torch.Tensor:
    return reference.kv_inject_attention_reference(
        q, k_block, v_block, k_cache, v_cache, cache_lens, scale=scale, causal_block=causal_block, window=window,
        k_scale=k_scale, v_scale=v_scale)


@_kv_inject_attention.register_kernel("cuda")
def _kv_inject_attention_cuda(q, k_block, v_block, k_cache, v_cache, cache_lens, scale, causal_block, window,
                              k_scale, v_scale):
    from . import kernel

    return kernel.kv_inject_attention_triton(
        q, k_block, v_block, k_cache, v_cache, cache_lens, scale=scale, causal_block=causal_block, window=window,
        k_scale=k_scale, v_scale=v_scale)


@_kv_inject_attention.register_fake
def _kv_inject_attention_fake(q, k_block, v_block, k_cache, v_cache, cache_lens, scale, causal_block, window,
                              k_scale, v_scale):
    problem = checks.check_attention(
        tensor_meta(q), tensor_meta(k_block), tensor_meta(v_block), tensor_meta(k_cache), tensor_meta(v_cache),
        tensor_meta(cache_lens), scale=scale, causal_block=causal_block, window=window,
        k_scale=_meta(k_scale), v_scale=_meta(v_scale))
    assert checks.attention_output(problem).shape == tuple(q.shape)
    return q.new_empty(q.shape)  # contiguous, like both real implementations


@torch.library.custom_op("trtllm_dflash::append_context", mutates_args=("k_cache", "v_cache", "cache_lens"))
def _append_context(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    cache_lens: torch.Tensor,
    new_lens: torch.Tensor,
    k_scale: Optional[torch.Tensor],
    v_scale: Optional[torch.Tensor],
) -> None:
    reference.append_context_reference(k_cache, v_cache, k_new, v_new, cache_lens, new_lens,
                                       k_scale=k_scale, v_scale=v_scale)


@_append_context.register_kernel("cuda")
def _append_context_cuda(k_cache, v_cache, k_new, v_new, cache_lens, new_lens, k_scale, v_scale):
    from . import kernel

    kernel.append_context_triton(k_cache, v_cache, k_new, v_new, cache_lens, new_lens,
                                 k_scale=k_scale, v_scale=v_scale)


@_append_context.register_fake
def _append_context_fake(k_cache, v_cache, k_new, v_new, cache_lens, new_lens, k_scale, v_scale):
    checks.check_append(
        tensor_meta(k_cache), tensor_meta(v_cache), tensor_meta(k_new), tensor_meta(v_new),
        tensor_meta(cache_lens), tensor_meta(new_lens), k_scale=_meta(k_scale), v_scale=_meta(v_scale))


def kv_inject_attention(
    q: torch.Tensor,  # [B, T, Hq, D] block queries, RoPE applied at positions cache_lens[b] + t
    k_block: torch.Tensor,  # [B, T, Hkv, D] block keys (RoPE applied)
    v_block: torch.Tensor,  # [B, T, Hkv, D]
    k_cache: torch.Tensor,  # [B, S_max, Hkv, D] context keys, valid up to cache_lens[b]
    v_cache: torch.Tensor,  # [B, S_max, Hkv, D]
    cache_lens: torch.Tensor,  # [B] int32
    *,
    scale: Optional[float] = None,  # softmax scale, default 1/sqrt(D)
    causal_block: bool = False,  # block query t sees block keys <= t only
    window: Optional[int] = None,  # a query at position p sees keys at positions > p - window
    k_scale: Optional[torch.Tensor] = None,  # () / (1,) / (Hkv,) float32, with a float8_e4m3fn cache
    v_scale: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Each block query attends to cache[:cache_lens[b]] followed by the block. Returns [B, T, Hq, D]."""
    return torch.ops.trtllm_dflash.kv_inject_attention(
        q, k_block, v_block, k_cache, v_cache, cache_lens, scale, causal_block, window, k_scale, v_scale)


def append_context(
    k_cache: torch.Tensor,  # [B, S_max, Hkv, D], written in place
    v_cache: torch.Tensor,  # [B, S_max, Hkv, D], written in place
    k_new: torch.Tensor,  # [B, N, Hkv, D] new context keys (RoPE applied at their absolute positions)
    v_new: torch.Tensor,  # [B, N, Hkv, D]
    cache_lens: torch.Tensor,  # [B] int32, advanced in place by new_lens
    new_lens: torch.Tensor,  # [B] int32, rows of k_new / v_new to append per sequence (<= N)
    *,
    k_scale: Optional[torch.Tensor] = None,  # quantization scales for a float8_e4m3fn cache
    v_scale: Optional[torch.Tensor] = None,
) -> None:
    """cache[b, cache_lens[b] + i] = new[b, i] for i < new_lens[b]; then cache_lens += new_lens."""
    torch.ops.trtllm_dflash.append_context(k_cache, v_cache, k_new, v_new, cache_lens, new_lens, k_scale, v_scale)
