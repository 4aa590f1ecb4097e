"""A drafter split over the tensor-parallel ranks of a leader-mode deployment (placement split,
recipe/plan/drafter.py drafter_placement; docs/engine-tp.md).

Every rank holds its shard of the drafter engine, and the shards must run each pass together:
the engine's collectives (two all-reduces per layer, the fc and LM-head all-gathers: TensorRT-
LLM's NCCL plugin) wait for every rank. Rank 0 owns the round loop. Before each call it makes on
one of its ArenaDrafters it broadcasts that call to the other ranks (`SplitDrafters` /
`MirroredDrafter`): create, join, keep, draft with its inputs, release, stop; their
`serve_drafter_rank` loop makes the same call on their own ArenaDrafter (same arena rows, same
lengths, their KV heads). A round's inputs cross once: anchors and positions in the call's
header, the new context rows as one tensor broadcast.

`TorchRankGroup` is that broadcast channel over torch.distributed: gloo on CPU (the tests run
rank 0 and a worker rank in two processes, on TorchDrafterSession shards), NCCL on GPU, set up
from the MPI launcher's environment (`from_mpi`: rank 0's address travels by an mpi4py
broadcast, as every rank of an mpirun / srun world can reach it).
"""

from __future__ import annotations

import itertools
import socket
from typing import Callable, Protocol

import torch


class RankGroup(Protocol):
    rank: int
    world: int
    device: torch.device

    def send(self, msg: tuple) -> None:
        """Rank 0: `msg` (a tuple of plain Python values) to every other rank."""

    def recv(self) -> tuple:
        """Ranks > 0: the next message rank 0 sent."""

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        """Rank 0's `t` on every rank (elsewhere `t` is a buffer of its shape and dtype)."""


class TorchRankGroup:
    """RankGroup over the default torch.distributed process group (every rank of it)."""

    def __init__(self, rank: int, world: int, device: torch.device | str = "cpu"):
        self.rank, self.world, self.device = rank, world, torch.device(device)

    def _objects(self, box: list) -> list:
        # NCCL moves objects through a tensor on this rank's GPU; gloo through a CPU one.
        torch.distributed.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        return box

    def send(self, msg: tuple) -> None:
        self._objects([msg])

    def recv(self) -> tuple:
        return self._objects([None])[0]

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        torch.distributed.broadcast(t, src=0)
        return t

    @classmethod
    def from_mpi(cls, rank: int, world: int, device: str) -> TorchRankGroup:
        """NCCL over the ranks of the MPI world this process was started in (mpi4py: a
        dependency of TensorRT-LLM, whose Executor has initialised MPI by now): rank 0 picks a
        free port and broadcasts its address."""
        from mpi4py import MPI

        addr = None
        if rank == 0:
            with socket.socket() as s:
                s.bind(("", 0))
                addr = f"tcp://{socket.getfqdn()}:{s.getsockname()[1]}"
        addr = MPI.COMM_WORLD.bcast(addr, root=0)
        torch.cuda.set_device(torch.device(device))
        torch.distributed.init_process_group("nccl", init_method=addr, rank=rank, world_size=world)
        return cls(rank, world, device)


class MirroredDrafter:
    """DrafterRunner on rank 0 of a split drafter: each call goes to every other rank first
    (their serve_drafter_rank makes it on their shard), then to rank 0's own ArenaDrafter."""

    def __init__(self, inner, group: RankGroup, did: int):
        self.inner, self.group, self.did = inner, group, did
        self.block_size, self.mask_token_id = inner.block_size, inner.mask_token_id
        self.target_layer_ids = inner.target_layer_ids

    def join(self, n):
        self.group.send(("join", self.did, n))
        self.inner.join(n)

    def keep(self, idx):
        self.group.send(("keep", self.did, list(idx)))
        self.inner.keep(idx)

    def draft(self, anchor, start, ctx, ctx_pos, T):
        header = (anchor.tolist(), start.tolist(), ctx_pos.tolist(), tuple(ctx.shape), str(ctx.dtype).split(".")[-1])
        self.group.send(("draft", self.did, T, *header))
        if ctx.numel():  # a round without new context rows sends none
            self.group.tensor(ctx.to(self.group.device).contiguous())
        return self.inner.draft(anchor, start, ctx, ctx_pos, T)


class SplitDrafters:
    """Rank 0's drafter factory for EngineModel (drafter_factory): every drafter it makes is
    announced to the other ranks; release / stop end one drafter / the worker ranks' loops."""

    def __init__(self, group: RankGroup, make_drafter: Callable[[int], object]):
        self.group, self.make, self.ids = group, make_drafter, itertools.count(1)

    def __call__(self, max_len: int) -> MirroredDrafter:
        did = next(self.ids)
        self.group.send(("new", did, max_len))
        return MirroredDrafter(self.make(max_len), self.group, did)

    def release(self, drafter: MirroredDrafter) -> None:
        self.group.send(("release", drafter.did))

    def stop(self) -> None:
        self.group.send(("stop", 0))


def serve_drafter_rank(group: RankGroup, make_drafter: Callable[[int], object]) -> int:
    """Ranks > 0: make rank 0's drafter calls on this rank's shard, in rank 0's order, until it
    says stop. Returns the number of drafting passes run."""
    drafters: dict[int, object] = {}
    passes = 0
    while (msg := group.recv())[0] != "stop":
        op, did, *args = msg
        if op == "new":
            drafters[did] = make_drafter(*args)
        elif op == "release":
            drafters.pop(did, None)
        elif op in ("join", "keep"):
            getattr(drafters[did], op)(*args)
        else:  # draft
            T, anchor, start, ctx_pos, shape, dtype = args
            ctx = torch.empty(shape, dtype=getattr(torch, dtype), device=group.device)
            if ctx.numel():
                group.tensor(ctx)
            drafters[did].draft(torch.tensor(anchor), torch.tensor(start), ctx, torch.tensor(ctx_pos), T)
            passes += 1
    return passes
