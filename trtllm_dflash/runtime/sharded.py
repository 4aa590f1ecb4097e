"""A checkpoint's model in `tp` worker processes, each holding only its rank's shard, joined by
torch.distributed (gloo on CPU, NCCL on GPU): `ShardedModel` hands out proxies of the reference
Decoder whose every call runs on every rank, in the same order, so the ranks' collectives match."""

from __future__ import annotations

import queue
import socket
import traceback
from typing import Sequence

import torch

from trtllm_dflash.errors import UserError
from trtllm_dflash.policy.decision import Drafts
from trtllm_dflash.recipe.hardware import cpu_torch_threads
from trtllm_dflash.runtime.checkpoint import CheckpointInfo, read_checkpoint
from trtllm_dflash.runtime.rank_model import rank_model
from trtllm_dflash.runtime.tp_layers import Comm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, tp: int, port: int, directory: str, dtype, device: str, runners: str, max_seq_len: int,
            commands: list, replies) -> None:
    """One rank: load its shard, then run Decoder calls as they come (every rank gets every call,
    in the same order, so their collectives match); rank 0 answers each call."""
    torch.set_num_threads(cpu_torch_threads(tp))
    dev = f"cuda:{rank}" if device.startswith("cuda") else device
    if dev.startswith("cuda"):
        torch.cuda.set_device(rank)
    torch.distributed.init_process_group(
        "nccl" if dev.startswith("cuda") else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=tp
    )
    answer = replies.put if rank == 0 else (lambda _: None)
    try:
        model = rank_model(runners, read_checkpoint(directory), Comm(rank, tp), dtype, dev, max_seq_len)
        decoders: dict = {}
        answer(("ok", model.capabilities, 0))
        while (cmd := commands[rank].get())[0] != "stop":
            op, did, *rest = cmd
            try:
                result = None
                if op == "new":
                    decoders[did] = model.decoder(**rest[0])
                elif op == "call":
                    result = getattr(decoders[did], rest[0])(*rest[1])
                else:  # "release"
                    decoders.pop(did, None)
                answer(("ok", result, decoders[did].running if did in decoders else 0))
            except UserError as e:
                answer(("error", str(e), 0))
        # Every rank finishes its last collective before any rank tears down its group: a
        # rank that exits while its peer is still inside gloo makes the peer abort.
        torch.distributed.barrier()
    except BaseException as e:
        answer(("fatal", f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}", 0))
        raise
    finally:
        torch.distributed.destroy_process_group()


class RankFailed(UserError):
    """A tensor-parallel rank died or failed: the model can no longer serve any request."""


class ShardedModel:
    """The reference target + drafter of a checkpoint in `tp` worker processes (torch.distributed:
    gloo on CPU, NCCL on GPU), each holding only its rank's shard. `decoder()` returns a proxy
    with the reference Decoder's interface (admit / step / cancel / running) whose calls run on
    every rank; the serving batcher and `checkpoint_steps` drive it like a local Decoder.

    If a rank dies (or raises), the call that finds out raises RankFailed naming the rank and how
    it ended, the surviving ranks are stopped (a peer of a dead rank would wait in a collective),
    and every later call raises the same at once: `failed` holds the reason."""

    failed: str | None = None

    def __init__(self, info: CheckpointInfo, tp: int, dtype: torch.dtype | None, device: str,
                 runners: str = "reference", max_seq_len: int = 2048):
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.eos_token_ids = info.target_cfg.eos_token_ids
        self._commands = [ctx.Queue() for _ in range(tp)]
        self._replies = ctx.Queue()
        self._next = 0
        self._procs = mp.start_processes(
            _worker, args=(tp, _free_port(), str(info.directory), dtype, device, runners, max_seq_len, self._commands,
                           self._replies),
            nprocs=tp, join=False, start_method="spawn",
        )
        self.capabilities, _ = self._reply()  # rank 0 loaded its shard: what its runners decode

    @property
    def pids(self) -> list[int]:
        """The rank processes' ids, in rank order."""
        return [p.pid for p in self._procs.processes]

    def _reply(self):
        while True:
            try:
                kind, result, running = self._replies.get(timeout=0.2)
            except queue.Empty:
                if any(p.exitcode is not None for p in self._procs.processes):
                    self._fail("")
                continue
            if kind == "fatal":
                self._fail(result, reporter=0)  # only rank 0 answers
            if kind == "error":
                raise UserError(result)
            return result, running

    def _fail(self, detail: str, reporter: int | None = None):
        """Record why the model cannot serve, stop the ranks still running, raise RankFailed.

        `detail` is what rank `reporter` raised, if one did. The reason names the cause
        first, whichever failure the serving loop saw first: the ranks (other than the reporting
        one) that had ended when the failure was seen or were killed by a signal, then what the
        rank raised, then the ranks that exited after it (a peer of a failed rank fails in its
        next collective). So a killed rank 1 comes before rank 0's collective error and rank 0
        raising alone before rank 1's exit that followed."""
        import time

        others = {r: p for r, p in enumerate(self._procs.processes) if r != reporter}
        gone = lambda: [r for r, p in others.items() if p.exitcode is not None]  # noqa: E731
        seen = set(gone())
        deadline = time.monotonic() + 0.5  # a dead peer's exit shows within ms of its sockets closing
        while not gone() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # let the peers of a dead rank fail in their next collective
        ended = gone()
        cause = sorted((r for r in ended if r in seen or others[r].exitcode < 0),
                       key=lambda r: (others[r].exitcode >= 0, r))  # signals first: the likelier cause
        words = lambda ranks: "; ".join(f"rank {r} {_how_ended(others[r].exitcode)}" for r in ranks)  # noqa: E731
        parts = [words(cause), detail.splitlines()[0] if detail else "", words(r for r in ended if r not in cause)]
        self.failed = (f"tensor-parallel {'; '.join(x for x in parts if x)}: this model cannot serve any more "
                       "requests; restart the server")
        for p in self._procs.processes:
            if p.is_alive():
                p.terminate()
        raise RankFailed(self.failed)

    def _send(self, *cmd):
        if self.failed:
            raise RankFailed(self.failed)
        for q in self._commands:
            q.put(cmd)
        return self._reply()

    def decoder(self, *, sampling, mode: str = "dflash", block_size: int | None = None,
                ddtree_budget: int | None = None, max_len: int = 2048) -> "_RemoteDecoder":
        self._next += 1
        self._send("new", self._next, dict(sampling=sampling, mode=mode, block_size=block_size,
                                           ddtree_budget=ddtree_budget, max_len=max_len))
        return _RemoteDecoder(self, self._next)

    def release(self, decoder: "_RemoteDecoder") -> None:
        if not self.failed:  # a failed model's ranks are gone: nothing to release
            self._send("release", decoder.did)

    def close(self) -> None:
        for q in self._commands:
            q.put(("stop", 0))
        try:
            while not self.failed and not self._procs.join(timeout=30):
                pass
        finally:
            for p in self._procs.processes:
                if p.is_alive():
                    p.terminate()


def _how_ended(exitcode: int) -> str:
    """A process exit code in words: 'exited with code 1' or 'was killed by SIGKILL'."""
    import signal

    if exitcode < 0:
        return f"was killed by {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}"


class _RemoteDecoder:
    """A Decoder living on every rank of a ShardedModel; rank 0's results come back."""

    def __init__(self, model: ShardedModel, did: int):
        self.model, self.did, self.running = model, did, 0

    def _call(self, method: str, *args):
        result, self.running = self.model._send("call", self.did, method, args)
        return result

    def admit(self, ids: Sequence[int], prompts: Sequence[Sequence[int]], limits: Sequence[int],
              stops: Sequence[Sequence[int]], bad_words: Sequence[Sequence[Sequence[int]] | None] | None = None,
              logprobs: Sequence[bool] | None = None):
        bad = None if bad_words is None else [None if w is None else [list(x) for x in w] for w in bad_words]
        return self._call("admit", list(ids), [list(p) for p in prompts], list(limits), [list(s) for s in stops], bad,
                          None if logprobs is None else list(logprobs))

    def step(self, drafts: Drafts = Drafts()):
        # the decision travels pickled, its trim (a policy's bound method) too: every rank trims
        # with the same state from the same drafter logits, so the ranks' rounds stay identical
        return self._call("step", drafts)

    def cancel(self, ids: Sequence[int]) -> None:
        self._call("cancel", list(ids))
