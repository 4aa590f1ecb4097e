"""The reference backend over a converted or quantized checkpoint, tensor-parallel.

`open_checkpoint(DIR)` loads the TensorRT-LLM layout `convert` / `quantize` wrote (checkpoint.py):
in this process for tp = 1, else in `tp` processes that each hold only their rank's shard
(sharded.py `ShardedModel`); either way each rank's model comes from rank_model.py. Either hands
out reference Decoders, so the serving batcher serves exactly the checkpoint that was deployed,
and `checkpoint_steps` (`generate --checkpoint`) yields the same `StepRecord`s as
`reference.generate_steps`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

import torch

from trtllm_dflash.errors import UserError
from trtllm_dflash.runtime import CPU_RUNNERS
from trtllm_dflash.runtime.checkpoint import read_checkpoint
from trtllm_dflash.runtime.rank_model import rank_model
from trtllm_dflash.runtime.sharded import ShardedModel
from trtllm_dflash.runtime.tp_layers import Comm


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
        raise UserError(f"--tp {tp}: {directory} is sharded for tp={info.tp} (mapping.tp_size); convert again for "
                        "another tp")
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
