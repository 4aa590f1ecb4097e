"""A drafter split over the ranks of a leader-mode deployment (runtime/drafter_ranks.py): rank 0
broadcasts every call of its drafters (create, join, keep, draft with its inputs, release, stop)
and the other ranks make the same calls on theirs.

- in one process, a worker thread over a queue: the worker's arena ends every call equal to
  rank 0's (same rows, same lengths, same K/V), through joins, a cancel (keep) and releases,
  and rank 0's decoder gives the tp 1 tokens;
- slow: two processes over gloo with real drafter shards (TorchDrafterSession, the CPU stand-in
  of the drafter engine, whose collectives then need both ranks in every pass): the tokens and
  rounds of tp 1.
"""

import queue
import threading

import pytest
import torch
from test_engine_runners import play

from reference_helpers import make_drafter, make_target
from trtllm_dflash.reference import SamplingParams, load_pair
from trtllm_dflash.runtime.drafter_ranks import SplitDrafters, serve_drafter_rank
from trtllm_dflash.runtime.drafter_runner import ArenaDrafter, TorchDrafterSession
from trtllm_dflash.runtime.engine_runners import EngineModel, engine_model_from_pair


class QueueGroup:
    """RankGroup stand-in between two threads: one ordered queue carries messages and tensors."""

    def __init__(self, rank, q):
        self.rank, self.world, self.device, self.q = rank, 2, torch.device("cpu"), q

    def send(self, msg):
        self.q.put(msg)

    def recv(self):
        return self.q.get(timeout=30)

    def tensor(self, t):
        if self.rank == 0:
            self.q.put(t.clone())
            return t
        t.copy_(self.q.get(timeout=30))
        return t


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("drafter-ranks")
    t = make_target(root / "t", "qwen3", seed=3)
    return load_pair(t, make_drafter(root / "d", t, seed=4, block_size=8))


def test_worker_ranks_make_rank_0_s_drafter_calls(pair):
    target, drafter = pair
    base = engine_model_from_pair(target, drafter, max_seq_len=64)
    d = drafter.cfg
    made, runs = {0: [], 1: []}, []

    class Session(TorchDrafterSession):  # counts rank 0's drafting passes
        def run(self, inputs, outputs):
            runs.append(1)
            super().run(inputs, outputs)

    def maker(rank):
        def make(max_len):  # every rank's drafter (whole here: the protocol, not the shards, is under test)
            session = (Session if rank == 0 else TorchDrafterSession)(base.w, base.spec, base.rope, max_len=max_len)
            made[rank].append(ArenaDrafter(session, block_size=d.block_size, mask_token_id=d.mask_token_id,
                                           target_layer_ids=tuple(d.target_layer_ids), max_len=max_len))
            return made[rank][-1]
        return make

    q = queue.Queue()
    passes = []
    worker = threading.Thread(target=lambda: passes.append(serve_drafter_rank(QueueGroup(1, q), maker(1))))
    worker.start()
    model = EngineModel(base.executor, None, d, vocab_size=target.cfg.vocab_size,
                        eos_token_ids=target.cfg.eos_token_ids,
                        drafter_factory=SplitDrafters(QueueGroup(0, q), maker(0)))
    events = [(0, "admit", [0, 1], [[5, 9, 2, 7, 1, 3], [4, 4, 8]], [12, 12]), (1, "admit", [2], [[11, 12, 13]], [9]),
              (2, "cancel", [0], None, None)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads of torch each on a 2-core machine crawl
    try:
        for _ in range(2):  # a second decoder after the first is released
            dec = model.decoder(sampling=SamplingParams(), max_len=32)
            got = play(dec, events, [])
            model.release(dec)
    finally:
        model.close()
        worker.join(timeout=30)
        torch.set_num_threads(threads)
    assert got == play(engine_model_from_pair(target, drafter, max_seq_len=64).decoder(
        sampling=SamplingParams(), max_len=32), events, [])
    assert passes == [len(runs)] and runs  # every drafting pass of rank 0, both decoders
    for a, b in zip(made[0], made[1], strict=True):  # the worker's arenas followed rank 0's, row for row
        assert a.lens == b.lens and torch.equal(a.arena.lens, b.arena.lens)
        assert all(torch.equal(x, y) for x, y in zip([*a.arena.k, *a.arena.v], [*b.arena.k, *b.arena.v]))


def _split_rank(rank, port, directory, events, results):
    """One rank of a 2-rank split drafter over gloo: rank 0 decodes (the whole target through
    the CPU Executor stand-in: the target's own TP is the Executor's business), rank 1 serves."""
    import dataclasses

    from trtllm_dflash.formats.weight_maps import Heads
    from trtllm_dflash.reference.target import Rope
    from trtllm_dflash.runtime.checkpoint import read_checkpoint, read_rank
    from trtllm_dflash.runtime.drafter_ranks import TorchRankGroup
    from trtllm_dflash.runtime.networks import DrafterSpec
    from trtllm_dflash.runtime.tp_layers import Comm

    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        info = read_checkpoint(directory / "tp2")  # its drafter is split over 2 ranks
        d, comm, group = info.drafter_cfg, Comm(rank, 2), TorchRankGroup(rank, 2)
        heads = Heads(d.num_heads, d.num_kv_heads, d.head_dim).local(2)
        spec = dataclasses.replace(DrafterSpec.from_config(d), num_heads=heads.num_heads,
                                   num_kv_heads=heads.num_kv_heads)
        weights, rope = read_rank(info, "drafter", rank, info.dtype), Rope(d.rope, d.head_dim)

        def make(max_len):
            session = TorchDrafterSession(weights, spec, rope, max_len=max_len, comm=comm)
            return ArenaDrafter(session, block_size=d.block_size, mask_token_id=d.mask_token_id,
                                target_layer_ids=tuple(d.target_layer_ids), max_len=max_len)

        if rank:
            results.put(("passes", serve_drafter_rank(group, make)))
            return
        from trtllm_dflash.runtime.checkpoint_runner import open_checkpoint

        base = open_checkpoint(directory / "tp1", runners="emulated", max_seq_len=64)
        model = EngineModel(base.executor, None, d, vocab_size=info.target_cfg.vocab_size,
                            eos_token_ids=info.target_cfg.eos_token_ids, drafter_factory=SplitDrafters(group, make))
        try:
            results.put(("log", play(model.decoder(sampling=SamplingParams(), max_len=64), events, [])))
        finally:
            model.close()
    finally:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


@pytest.mark.slow  # two spawned processes: 10-20 s
def test_a_split_drafter_over_two_gloo_ranks_gives_the_tp1_tokens(tmp_path):
    import torch.multiprocessing as mp

    from trtllm_dflash.convert.convert import convert
    from trtllm_dflash.prompts.sources import heldout_token_prompts
    from trtllm_dflash.recipe import load_recipe
    from trtllm_dflash.runtime.checkpoint_runner import open_checkpoint
    from trtllm_dflash.runtime.sharded import _free_port

    one = load_recipe(None)
    convert(one, tmp_path / "tp1", progress=False)
    convert(load_recipe(None, ["parallel.tp=2"]), tmp_path / "tp2", progress=False)  # reference: split drafter
    prompts = heldout_token_prompts(one.target.path, 3, 24)
    events = [(0, "admit", [0, 1], prompts[:2], [24, 24]), (2, "admit", [2], prompts[2:], [24]),
              (3, "cancel", [1], None, None)]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    mp.start_processes(_split_rank, args=(_free_port(), tmp_path, events, results), nprocs=2, start_method="spawn")
    got = dict(results.get(timeout=60) for _ in range(2))
    torch.set_num_threads(1)
    ref = play(open_checkpoint(tmp_path / "tp1", max_seq_len=64).decoder(sampling=SamplingParams(), max_len=64),
               events, [])
    assert got["log"] == ref
    assert got["passes"] == sum(1 for rec in ref if rec[0] == "step")
