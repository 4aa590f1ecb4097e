"""Static, pre-allocated KV cache shared by the target and the drafter.

Slot s of a sequence always holds the K/V of absolute position s, so a cache "length" is
just the number of committed positions; trimming after a rejection is free (the stale
slots are masked out and overwritten by the next write). One extra slot at the end,
`trash`, is where padding entries point (the drafter's ragged context rows; DFlashDraft.forward
writes only the real ones, packed: `write(rows=...)`).

Sequences live in a pool of batch entries: `rows` maps the caller's row b to its entry.
A sequence that leaves frees its entry (no copy) and one that joins takes a free entry
(copying only its own K/V), so in-flight joins and leaves cost a row, not the whole cache
(a served batch at concurrency 16 spent 40% of its time copying caches before:
docs/design/measurements.md, "The KV cache as a pool of batch entries"). Reads gather the
rows in the caller's order, unless they already are entries [0, B) in order.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu"):
        shape = (num_layers, batch, num_kv_heads, max_len + 1, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, capacity, Hkv, S_max+1, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # [L, capacity, Hkv, S_max+1, D]
        self.rows = torch.arange(batch, device=device)  # [B]: the pool entry of each row
        self._in_order = True  # rows == [0, B): reads are plain slices
        self.max_len = max_len
        self.trash = max_len  # the slot padding entries point at; never attended

    @property
    def batch(self) -> int:
        return len(self.rows)

    def write(self, layer: int, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              rows: torch.Tensor | None = None) -> None:
        """pos [B, T] slots; k, v [B, T, Hkv, D]. rows: each entry's batch row, pos's shape (packed
        entries: [1, N]); default row b for pos[b]."""
        entries = self.rows[:, None] if rows is None else self.rows[rows]  # [B, 1] or pos's shape
        self.k[layer][entries, :, pos] = k
        self.v[layer][entries, :, pos] = v

    def view(self, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `length` slots of every sequence: k, v [B, Hkv, length, D]."""
        if self._in_order:
            B = self.batch
            return self.k[layer, :B, :, :length], self.v[layer, :B, :, :length]
        return (self.k[layer, :, :, :length].index_select(0, self.rows),
                self.v[layer, :, :, :length].index_select(0, self.rows))

    def move(self, row: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slots src -> dst of one sequence in every layer (DDTree compaction).
        The gather on the right happens before the write, so overlapping ranges are safe."""
        e = int(self.rows[row])
        self.k[:, e, :, dst] = self.k[:, e, :, src]
        self.v[:, e, :, dst] = self.v[:, e, :, src]

    def extend(self, other: "KVCache") -> None:
        """Append another cache's sequences (same layers, heads and max_len) as new batch rows:
        they take free pool entries (the pool doubles when none is left)."""
        assert other.max_len == self.max_len and other.k.shape[2:] == self.k.shape[2:], "cache shapes differ"
        n, capacity = other.batch, self.k.shape[1]
        used = set(self.rows.tolist())
        free = [e for e in range(capacity) if e not in used][:n]
        if len(free) < n:
            grow = max(capacity, n - len(free))
            pad = (0, 0, 0, 0, 0, 0, 0, grow)  # [L, capacity + grow, ...]: the pool grows at the end
            self.k, self.v = torch.nn.functional.pad(self.k, pad), torch.nn.functional.pad(self.v, pad)
            free += list(range(capacity, capacity + n - len(free)))
        entries = torch.tensor(free, device=self.rows.device)
        self.k[:, entries] = other.k.index_select(1, other.rows)
        self.v[:, entries] = other.v.index_select(1, other.rows)
        self._set_rows(torch.cat([self.rows, entries]))

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Drop finished sequences: keep batch rows `rows` (in that order); the others' entries are free."""
        self._set_rows(self.rows[rows.to(self.rows.device)])

    def _set_rows(self, rows: torch.Tensor) -> None:
        self.rows = rows
        self._in_order = bool((rows == torch.arange(len(rows), device=rows.device)).all())
