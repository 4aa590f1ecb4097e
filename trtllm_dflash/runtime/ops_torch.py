"""TorchOps: the networks' op set (networks.py) on torch tensors, and the drafter's arena.

The math is the reference backend's (RMSNorm, NeoX RoPE tables from reference/target.py;
DFlash2's convolution and selector from reference/draft.py);
attention and the context append are the KV-injection plugin's torch ops
(plugins/kv_inject_attention: the Triton kernel on CUDA, its float32 reference elsewhere), so
the CPU drafter runner exercises the very contract the TensorRT plugin implements.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from trtllm_dflash.plugins.kv_inject_attention import append_context, kv_inject_attention
from trtllm_dflash.reference.draft import dynamic_conv, select_path
from trtllm_dflash.reference.target import Rope, apply_rope


class Arena:
    """The drafter's context cache in the plugin's layout: per layer k, v [B, S_max, Hkv, D],
    valid up to lens[b] (= the positions of context appended so far). Rows are the runner's rows."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, max_len: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu"):
        self.shape = (max_len, kv_heads, head_dim)
        self.k = [torch.zeros(0, *self.shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(0, *self.shape, dtype=dtype, device=device) for _ in range(layers)]
        self.lens = torch.zeros(0, dtype=torch.int32, device=device)  # [B]

    @property
    def max_len(self) -> int:
        return self.shape[0]

    def join(self, n: int) -> None:
        for c in (self.k, self.v):
            for i, t in enumerate(c):
                c[i] = torch.cat([t, t.new_zeros(n, *self.shape)])
        self.lens = torch.cat([self.lens, self.lens.new_zeros(n)])

    def keep(self, idx: list[int]) -> None:
        sel = torch.tensor(idx, dtype=torch.long, device=self.lens.device)
        for c in (self.k, self.v):
            for i, t in enumerate(c):
                c[i] = t[sel].contiguous()
        self.lens = self.lens[sel]


# Tensor parallelism as the convert stage splits the drafter checkpoint (formats/weight_maps.py
# DRAFTER_MAP) and as TensorRT-LLM's ColumnLinear / RowLinear / vocab-parallel Embedding run it:
# q, kv, mlp.fc and mlp.gate stay local (per rank's heads / FFN columns); these need a collective.
GATHERED = ("dflash.fc", "lm_head")  # column-parallel, output all-gathered (fc before hidden_norm)
REDUCED = ("attention.dense", "mlp.proj")  # row-parallel, output all-reduced (bias added once, after)


class SingleRank:
    """The collectives of one process (tp = 1): identities. runtime/tp_layers.Comm is the tp > 1 one."""

    rank, world = 0, 1

    def all_reduce(self, x):
        return x

    def all_gather_last(self, x):
        return x

    def broadcast(self, x):
        return x


class TorchOps:
    """ops over `weights` {checkpoint name: tensor} of one rank; `arena` and `new_lens` [B]
    (context rows each sequence appends in this pass) for the drafter, None for the target tap;
    `comm` runs the tensor-parallel collectives (rank logic above)."""

    def __init__(self, weights: dict[str, torch.Tensor], rope: Rope | None = None, arena: Arena | None = None,
                 new_lens: torch.Tensor | None = None, comm=SingleRank()):
        self.w, self.rope_table, self.arena, self.new_lens, self.comm = weights, rope, arena, new_lens, comm

    def embed(self, ids, name):
        table = self.w[name + ".weight"]  # vocab-parallel: rows [rank * n, (rank + 1) * n)
        if self.comm.world == 1:
            return F.embedding(ids, table)
        local = ids - self.comm.rank * table.shape[0]
        inside = (local >= 0) & (local < table.shape[0])
        return self.comm.all_reduce(F.embedding(local.clamp(0, table.shape[0] - 1), table) * inside[..., None])

    def linear(self, x, name):
        bias = self.w.get(name + ".bias")
        if self.comm.world > 1 and name.endswith(REDUCED):
            y = self.comm.all_reduce(F.linear(x, self.w[name + ".weight"]))
            return y if bias is None else y + bias
        y = F.linear(x, self.w[name + ".weight"], bias)
        return self.comm.all_gather_last(y) if self.comm.world > 1 and name in GATHERED else y

    def rms_norm(self, x, name, eps):
        w = self.w[name + ".weight"]
        return w * F.rms_norm(x.float(), w.shape, eps=eps).to(x.dtype)

    def heads(self, x, n, d):
        return x.view(*x.shape[:-1], n, d)

    def merge_heads(self, x):
        return x.reshape(*x.shape[:-2], -1)

    def split(self, x, sizes: Sequence[int]):
        return list(x.split(list(sizes), dim=-1))

    def concat(self, xs):
        return torch.cat(list(xs), dim=-1)

    def rope(self, x, pos):
        cos, sin = self.rope_table(pos, x.dtype)
        return apply_rope(x, cos, sin)

    def silu_mul(self, a, b):
        return F.silu(a) * b

    def add(self, a, b):
        return a + b

    def drop_first_token(self, x):
        return x[:, 1:]

    def inject(self, layer, k, v):
        lens = self.arena.lens.clone()  # every layer appends at the same offsets; the runner advances lens once
        append_context(self.arena.k[layer], self.arena.v[layer], k, v, lens, self.new_lens)

    def attend(self, layer, q, k, v, causal, window):
        lens = self.arena.lens + self.new_lens  # the context now includes this pass's rows
        return kv_inject_attention(q, k, v, self.arena.k[layer], self.arena.v[layer], lens.to(torch.int32),
                                   causal_block=causal, window=window)

    def scale(self, x, factor):
        return x * factor

    def softcap(self, x, cap):
        return torch.tanh(x / cap) * cap

    def conv_prepare(self, x, name, kernel, group):
        # [B, T, 2, K, G]
        dyn = F.linear(x, self.w[name + ".kernel_projection.weight"]).view(*x.shape[:2], 2, kernel, -1)
        return dynamic_conv(x, dyn[:, :, 0], self.w[name + ".base_kernel"][0], group), dyn[:, :, 1]

    def conv_finish(self, y, taps, name, group):
        return dynamic_conv(y, taps, self.w[name + ".base_kernel"][1], group)

    def select_path(self, hidden, logits, anchor, name, top_k):
        mod = F.linear(hidden, self.w[name + ".hidden_projection.weight"])  # [B, D, r]
        return select_path(self.w[name + ".predecessor_codebook"], self.w[name + ".successor_codebook"], mod, logits,
                           anchor, top_k).path
