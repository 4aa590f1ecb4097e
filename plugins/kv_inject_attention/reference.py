"""Pure-torch KV-injection attention: the fallback on non-CUDA devices and the test oracle.

Same signatures as the public API. Everything is computed in float32 from the inputs
(FP8 caches dequantized with their scales first) and the result is cast to q's dtype.

Positions (README.md in this folder, "The math"): cache entry s (0 <= s < cache_lens[b]) is at absolute
position s; block query / key t is at position cache_lens[b] + t.
"""

from typing import Optional

import torch

from . import checks
from .checks import tensor_meta

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def _meta(t: Optional[torch.Tensor]):
    return None if t is None else tensor_meta(t)


def dequantize_cache(cache: torch.Tensor, scale: Optional[torch.Tensor]) -> torch.Tensor:
    """[B, S, Hkv, D] cache -> float32; an FP8 cache is multiplied by its per-tensor or per-head scale."""
    if scale is None:
        return cache.float()
    return cache.float() * scale.float().reshape(1, 1, -1, 1)  # broadcasts () / (1,) / (Hkv,)


def quantize_to_cache(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """[B, N, Hkv, D] activations -> float8_e4m3fn with x = fp8 * scale (saturating at +-448)."""
    y = x.float() / scale.float().reshape(1, 1, -1, 1)
    return y.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


# Not reference.draft.key_limit: the kernel's independent oracle ([cache ; block] layout; window limits keys behind
# only).
def visible_keys(cache_lens: torch.Tensor, max_cache_len: int, block_len: int,
                 causal_block: bool, window: Optional[int]) -> torch.Tensor:
    """[B, T, S_max + T] bool: may block query t see key j of [cache ; block]?"""
    device = cache_lens.device
    lens = cache_lens.long()[:, None]  # [B, 1]
    s = torch.arange(max_cache_len, device=device)[None, :]  # [1, S_max]
    t = torch.arange(block_len, device=device)[None, :]  # [1, T]
    key_pos = torch.cat([s.expand(lens.shape[0], -1), lens + t], dim=1)  # [B, S_max + T]
    key_valid = torch.cat([s < lens, torch.ones_like(lens + t, dtype=torch.bool)], dim=1)  # [B, S_max + T]
    query_pos = lens + t  # [B, T]
    visible = key_valid[:, None, :].expand(-1, block_len, -1)  # [B, T, S_max + T]
    if causal_block:  # cache keys (pos < cache_len <= query pos) always pass
        visible = visible & (key_pos[:, None, :] <= query_pos[:, :, None])
    if window is not None:
        visible = visible & (query_pos[:, :, None] - key_pos[:, None, :] < window)
    return visible


def kv_inject_attention_reference(
    q: torch.Tensor,
    k_block: torch.Tensor,
    v_block: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    *,
    scale: Optional[float] = None,
    causal_block: bool = False,
    window: Optional[int] = None,
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Block queries attend over [cache[:cache_lens[b]] ; block]. Returns out [B, T, Hq, D] (contiguous, q.dtype)."""
    p = checks.check_attention(
        tensor_meta(q), tensor_meta(k_block), tensor_meta(v_block), tensor_meta(k_cache), tensor_meta(v_cache),
        tensor_meta(cache_lens), scale=scale, causal_block=causal_block, window=window,
        k_scale=_meta(k_scale), v_scale=_meta(v_scale),
    )
    checks.check_cache_lens_values(cache_lens.tolist(), p.max_cache_len)
    G = p.group_size

    visible = visible_keys(cache_lens, p.max_cache_len, p.block_len, causal_block, window)  # [B, T, S_max + T]
    keys = torch.cat([dequantize_cache(k_cache, k_scale), k_block.float()], dim=1)  # [B, S_max + T, Hkv, D]
    values = torch.cat([dequantize_cache(v_cache, v_scale), v_block.float()], dim=1)  # [B, S_max + T, Hkv, D]
    # Cache rows past cache_lens may hold anything (even NaN): zero them so 0 * NaN never happens.
    valid = visible.any(dim=1)[:, :, None, None]  # [B, S_max + T, 1, 1]
    keys = torch.where(valid, keys, 0.0).repeat_interleave(G, dim=2)  # [B, S_max + T, Hq, D]
    values = torch.where(valid, values, 0.0).repeat_interleave(G, dim=2)  # [B, S_max + T, Hq, D]

    scores = torch.einsum("bthd,bshd->bhts", q.float(), keys) * p.scale  # [B, Hq, T, S_max + T]
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # every query sees at least itself: no all -inf row
    out = torch.einsum("bhts,bshd->bthd", probs, values)  # [B, T, Hq, D]
    return out.to(q.dtype).contiguous()


def append_context_reference(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    cache_lens: torch.Tensor,
    new_lens: torch.Tensor,
    *,
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
) -> None:
    """Write k_new[b, :new_lens[b]] at cache[b, cache_lens[b]:], then cache_lens += new_lens (in place)."""
    p = checks.check_append(
        tensor_meta(k_cache), tensor_meta(v_cache), tensor_meta(k_new), tensor_meta(v_new),
        tensor_meta(cache_lens), tensor_meta(new_lens), k_scale=_meta(k_scale), v_scale=_meta(v_scale),
    )
    lens, news = cache_lens.tolist(), new_lens.tolist()
    checks.check_append_values(lens, news, p.max_new_len, p.max_cache_len)
    if p.cache_dtype == checks.FP8_CACHE_DTYPE:
        k_new, v_new = quantize_to_cache(k_new, k_scale), quantize_to_cache(v_new, v_scale)
    for b, (start, n) in enumerate(zip(lens, news)):
        k_cache[b, start:start + n] = k_new[b, :n]
        v_cache[b, start:start + n] = v_new[b, :n]
    cache_lens += new_lens
