"""One rank's model over its shard of a convert / quantize output: the reference runners
(`local_model.LocalModel`) or the engine runners over FakeExecutor. Both doors open it:
checkpoint_runner.py for tp = 1 in this process, sharded.py in each of its worker processes."""

from __future__ import annotations

import torch

from trtllm_dflash.runtime.checkpoint import CheckpointInfo, load_rank, load_target, read_rank
from trtllm_dflash.runtime.tp_layers import Comm


def _emulated_model(info, comm, dtype: torch.dtype | None, device: str, max_seq_len: int):
    """The engine runners on CPU over one rank of a convert / quantize output: FakeExecutor over
    TapEngine (this rank's target shard + its part of the drafter's fc and hidden_norm, read as
    the target engine reads them: formats/engine_io.py tap_weights) for the target, the torch
    drafter network for the drafter, placed as the checkpoint keeps it (recipe/plan/drafter.py
    drafter_placement): this rank's drafter shard, or the whole drafter on rank 0 only, whose
    drafts every rank then receives (engine_runners.Rank0Drafter)."""
    from trtllm_dflash.formats.engine_io import tap_weights
    from trtllm_dflash.runtime.engine_runners import EngineModel, FakeExecutor, TapEngine

    dtype = dtype or info.dtype
    target = load_target(info, comm, dtype, device)
    d = info.drafter_cfg
    tap = {k: v.to(device) for k, v in tap_weights(info.directory / "target", comm.rank, dtype).items()}
    engine = TapEngine(target, tap, tuple(d.target_layer_ids), d.rms_norm_eps, tail=d.block_size, comm=comm)
    executor = FakeExecutor(engine, max_seq_len=max_seq_len + d.block_size, max_input_len=max_seq_len + d.block_size)
    common = dict(vocab_size=info.target_cfg.vocab_size, eos_token_ids=info.target_cfg.eos_token_ids, device=device)
    if not info.drafter_whole:
        return EngineModel(executor, read_rank(info, "drafter", comm.rank, dtype, device), d, comm=comm, **common)
    weights = read_rank(info, "drafter", 0, dtype, device) if comm.rank == 0 else None
    return EngineModel(executor, weights, d, rank0_of=comm, draft_dtype=dtype, **common)


def rank_model(runners: str, info: CheckpointInfo, comm: Comm, dtype, device: str, max_seq_len: int):
    """One rank's model: the reference runners over its shard, or the engine runners (design C,
    FakeExecutor + the torch drafter network) over it."""
    if runners == "emulated":
        return _emulated_model(info, comm, dtype, device, max_seq_len)
    from trtllm_dflash.runtime.local_model import LocalModel

    return LocalModel(*load_rank(info, comm, dtype, device))
