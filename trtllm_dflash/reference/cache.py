"""Static, pre-allocated KV cache shared by the target and the drafter.

Slot s of a sequence always holds the K/V of absolute position s, so a cache "length" is
just the number of committed positions; trimming after a rejection is free (the stale
slots are masked out and overwritten by the next write). One extra slot at the end,
`trash`, absorbs writes of padding entries so that ragged batches need no dynamic shapes.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu"):
        shape = (num_layers, batch, num_kv_heads, max_len + 1, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, Hkv, S_max+1, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, Hkv, S_max+1, D]
        self.max_len = max_len
        self.trash = max_len  # slot index for padding writes; never attended

    def write(self, layer: int, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """pos [B, T] slots; k, v [B, T, Hkv, D]."""
        rows = torch.arange(pos.shape[0], device=pos.device)[:, None]  # [B, 1]
        self.k[layer][rows, :, pos] = k
        self.v[layer][rows, :, pos] = v

    def view(self, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `length` slots of every sequence: k, v [B, Hkv, length, D]."""
        return self.k[layer, :, :, :length], self.v[layer, :, :, :length]

    def move(self, row: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slots src -> dst of one sequence in every layer (DDTree compaction).
        The gather on the right happens before the write, so overlapping ranges are safe."""
        self.k[:, row, :, dst] = self.k[:, row, :, src]
        self.v[:, row, :, dst] = self.v[:, row, :, src]

    def extend(self, other: "KVCache") -> None:
        """Append another cache's sequences (same layers, heads and max_len) as new batch rows."""
        assert other.max_len == self.max_len and other.k.shape[2:] == self.k.shape[2:], "cache shapes differ"
        self.k = torch.cat([self.k, other.k], dim=1)
        self.v = torch.cat([self.v, other.v], dim=1)

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Drop finished sequences: keep batch rows `rows` (in that order)."""
        self.k = self.k[:, rows].contiguous()
        self.v = self.v[:, rows].contiguous()
