"""A reference target and drafter in this process: the simplest `serve.batcher.ServingModel`."""

from __future__ import annotations

from trtllm_dflash.reference.generate import Decoder
from trtllm_dflash.reference.verify import SamplingParams
from trtllm_dflash.runtime.capabilities import FULL


class LocalModel:
    """A reference target and drafter in this process."""

    failed = None  # nothing of it can die alone
    capabilities = FULL  # our torch target gives the full logits

    def __init__(self, target, drafter):
        self.target, self.drafter = target, drafter

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.target.cfg.eos_token_ids

    def decoder(self, *, sampling: SamplingParams, mode: str = "dflash", block_size: int | None = None,
                ddtree_budget: int | None = None, max_len: int = 2048) -> Decoder:
        return Decoder(self.target, self.drafter, mode, block_size, ddtree_budget, sampling, max_len)

    def release(self, decoder: Decoder) -> None:
        pass

    def close(self) -> None:
        pass
