"""The tensor-parallel pieces the reference modules need to run one rank's shard: the process
group's collectives (`Comm`; world 1: identities) and the two layers whose output every rank
needs whole, the vocab-parallel embedding and the all-gathered column-parallel linear."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Comm:
    """The tensor-parallel group of this process (world 1: every collective is the identity)."""

    def __init__(self, rank: int = 0, world: int = 1):
        self.rank, self.world = rank, world

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            torch.distributed.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's x on the last axis, in rank order."""
        if self.world == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world)]
        torch.distributed.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's x on every rank (x: a buffer of the same shape and dtype elsewhere)."""
        if self.world > 1:
            torch.distributed.broadcast(x, src=0)
        return x


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + n) of the embedding; ids outside them contribute zeros."""

    def __init__(self, n: int, hidden: int, start: int, comm: Comm):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, hidden))
        self.start, self.comm = start, comm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        inside = (local >= 0) & (local < self.weight.shape[0])
        x = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight) * inside[..., None]  # [B, T, H]
        return self.comm.all_reduce(x)


class GatherLinear(nn.Module):
    """Column-parallel linear whose output is all-gathered (LM head over the vocabulary, drafter fc)."""

    def __init__(self, in_features: int, out_local: int, comm: Comm):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_local, in_features))
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_gather_last(F.linear(x, self.weight))
