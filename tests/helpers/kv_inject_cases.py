"""Test helpers for KV-injection attention: random problems and a per-query loop oracle.

The loop oracle (`attention_by_loops`) is written independently of reference.py, straight
from the README's rules (positions, causal_block, window, GQA), in float64, so the
vectorized reference is itself checked.
"""

import math
from dataclasses import dataclass
from typing import List, Optional

import torch


@dataclass
class Case:
    """One randomized kv_inject_attention problem."""

    cache_lens: List[int]  # per batch row
    block_len: int  # T
    num_q_heads: int  # Hq
    num_kv_heads: int  # Hkv
    head_dim: int  # D
    max_cache_len: int  # S_max
    causal_block: bool = False
    window: Optional[int] = None
    scale: Optional[float] = None

    def __str__(self) -> str:
        return (f"lens={self.cache_lens} S_max={self.max_cache_len} T={self.block_len} Hq={self.num_q_heads} "
                f"Hkv={self.num_kv_heads} D={self.head_dim} causal={self.causal_block} window={self.window}")


def random_case(gen: torch.Generator, *, max_len: int, head_dims=(64, 128), max_batch: int = 3,
                max_kv_heads: int = 2) -> Case:
    """A random case: ragged cache lengths in [0, max_len] (0 and max_len favoured), T in 1..16, GQA 1..8."""
    def randint(lo, hi):  # inclusive
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    batch = randint(1, max_batch)
    lens = []
    for _ in range(batch):
        kind = randint(0, 4)
        lens.append(0 if kind == 0 else max_len if kind == 1 else randint(0, max_len))
    group = [1, 2, 4, 8][randint(0, 3)]
    hkv = randint(1, max_kv_heads)
    window = None if randint(0, 1) == 0 else [1, 3, 16, randint(1, max_len + 16)][randint(0, 3)]
    return Case(
        cache_lens=lens, block_len=randint(1, 16), num_q_heads=hkv * group, num_kv_heads=hkv,
        head_dim=head_dims[randint(0, len(head_dims) - 1)], max_cache_len=max(lens) + randint(0, 5),
        causal_block=bool(randint(0, 1)), window=window,
    )


def make_tensors(case: Case, dtype: torch.dtype, gen: torch.Generator, poison_cache_tail: bool = True):
    """q, k_block, v_block, k_cache, v_cache, cache_lens for `case`; cache rows past cache_lens hold NaN."""
    B, T, S = len(case.cache_lens), case.block_len, case.max_cache_len
    Hq, Hkv, D = case.num_q_heads, case.num_kv_heads, case.head_dim

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    q, k_block, v_block = randn(B, T, Hq, D), randn(B, T, Hkv, D), randn(B, T, Hkv, D)
    k_cache, v_cache = randn(B, S, Hkv, D), randn(B, S, Hkv, D)
    if poison_cache_tail:  # the attention must never read past cache_lens
        for b, n in enumerate(case.cache_lens):
            k_cache[b, n:] = float("nan")
            v_cache[b, n:] = float("nan")
    cache_lens = torch.tensor(case.cache_lens, dtype=torch.int32)
    return q, k_block, v_block, k_cache, v_cache, cache_lens


def attention_by_loops(q, k_block, v_block, k_cache, v_cache, cache_lens, *, scale=None, causal_block=False,
                       window=None, k_scale=None, v_scale=None) -> torch.Tensor:
    """Float64 oracle, one query at a time, following README.md literally."""
    B, T, Hq, D = q.shape
    Hkv = k_block.shape[2]
    G = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.zeros(B, T, Hq, D, dtype=torch.float64)
    for b in range(B):
        L = int(cache_lens[b])
        for h in range(Hq):
            kvh = h // G
            ks = k_scale.double().reshape(-1)[kvh if k_scale is not None and k_scale.numel() > 1 else 0] \
                if k_scale is not None else 1.0
            vs = v_scale.double().reshape(-1)[kvh if v_scale is not None and v_scale.numel() > 1 else 0] \
                if v_scale is not None else 1.0
            for t in range(T):
                p = L + t  # absolute position of the query
                keys, values = [], []
                for s in range(L):  # context entry s sits at position s
                    if window is None or p - s < window:
                        keys.append(k_cache[b, s, kvh].double() * ks)
                        values.append(v_cache[b, s, kvh].double() * vs)
                for u in range(T):  # block key u sits at position L + u
                    if (not causal_block or u <= t) and (window is None or p - (L + u) < window):
                        keys.append(k_block[b, u, kvh].double())
                        values.append(v_block[b, u, kvh].double())
                K, V = torch.stack(keys), torch.stack(values)
                w = torch.softmax((K @ q[b, t, h].double()) * scale, dim=0)
                out[b, t, h] = w @ V
    return out
