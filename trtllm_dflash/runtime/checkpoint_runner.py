"""The reference backend over a converted or quantized checkpoint, tensor-parallel.

`open_checkpoint(DIR)` loads the TensorRT-LLM layout `convert` / `quantize` wrote (checkpoint.py):
in this process for tp = 1 (`local_model.LocalModel`), else in `tp` processes that each hold only
their rank's shard (sharded.py `ShardedModel`). Either hands out reference Decoders, so the
serving batcher serves exactly the checkpoint that was deployed, and `checkpoint_steps`
(`generate --checkpoint`) yields the same `StepRecord`s as `reference.generate_steps`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

import torch

from trtllm_dflash.errors import UserError
from trtllm_dflash.runtime import CPU_RUNNERS
from trtllm_dflash.runtime.checkpoint import CheckpointInfo, load_rank, load_target, read_checkpoint, read_rank
from trtllm_dflash.runtime.sharded import ShardedModel
from trtllm_dflash.runtime.tp_layers import Comm


def _emulated_model(info, comm, dtype: torch.dtype | None, device: str, max_seq_len: int):
    """The engine runners on CPU over one rank of a convert / quantize output: FakeExecutor over
    TapEngine (this rank's target shard + its part of the drafter's fc and hidden_norm, read as
    the target engine reads them: formats/engine_io.py tap_weights) for the target, the torch
    drafter network for the drafter, placed as the checkpoint keeps it (recipe/planner.py
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


def open_checkpoint(directory: str | Path, tp: int | None = None, dtype: torch.dtype | None = None,
                    device: str = "cpu", runners: str = "reference", max_seq_len: int = 2048):
    """A convert / quantize output, ready to decode: one model in this process (tp == 1) or a
    `ShardedModel` (tp worker processes). runners: "reference" (our torch modules) or "emulated"
    (the engine backend's runners over FakeExecutor). tp defaults to the checkpoint's (it is
    sharded for exactly that many ranks); max_seq_len bounds an emulated engine's requests."""
    if runners not in CPU_RUNNERS:  # what decodes a checkpoint: our torch modules, or the engine runners
        raise UserError(f"runners {runners!r}: allowed: {', '.join(CPU_RUNNERS)}")
    info = read_checkpoint(directory)
    tp = tp or info.tp
    if tp != info.tp:
        raise UserError(f"--tp {tp}: {directory} is sharded for tp={info.tp} (mapping.tp_size); convert again for another tp")
    if device.startswith("cuda") and tp > torch.cuda.device_count():
        raise UserError(f"--tp {tp} on {device} needs {tp} GPUs, found {torch.cuda.device_count()}")
    if tp == 1:
        return rank_model(runners, info, Comm(), dtype, device, max_seq_len)
    return ShardedModel(info, tp, dtype, device, runners, max_seq_len)


def checkpoint_steps(
    directory: str | Path,
    prompts: Sequence[Sequence[int]],
    max_new_tokens,
    tp: int | None = None,
    dtype: torch.dtype | None = None,
    device: str = "cpu",
    mode: str = "dflash",
    block_size: int | None = None,
    ddtree_budget: int | None = None,
    sampling=None,
    stop_token_ids: Sequence[int] | None = None,
    runners: str = "reference",
) -> Iterator:
    """`reference.generate_steps` over a converted / quantized checkpoint, in `tp` processes,
    with the reference runners or the emulated engine runners."""
    from trtllm_dflash.reference.verify import SamplingParams

    limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    model = open_checkpoint(directory, tp, dtype, device, runners, max(len(p) for p in prompts) + max(limits))
    try:
        decoder = model.decoder(mode=mode, block_size=block_size, ddtree_budget=ddtree_budget,
                                sampling=sampling or SamplingParams(),
                                max_len=max(len(p) for p in prompts) + max(limits))
        stops = list(model.eos_token_ids if stop_token_ids is None else stop_token_ids)
        yield decoder.admit(list(range(len(prompts))), prompts, limits, [stops] * len(prompts))
        while decoder.running:
            yield decoder.step()
    finally:
        model.close()
