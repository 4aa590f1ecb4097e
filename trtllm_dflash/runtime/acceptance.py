"""Acceptance of a converted / quantized checkpoint, decoded as it is served.

`decode_rounds` runs `checkpoint_runner.checkpoint_steps` (the decoder `generate --checkpoint`
and the servers run, over the weights the stage wrote: quantized ones dequantized as served)
on a batch of prompts, greedy, and returns every verify round's (accepted drafts, drafted)
with the decode's tokens and time. `profile` turns that into per-category profiles
(project/profile.py); the quantize stage's guardrail compares the tau before and after
(quantize/stage.py), through `checkpoint_tau`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence


@dataclass
class Decoded:
    """What one greedy decode of a batch of prompts did."""

    mode: str
    rounds: list[tuple[int, int]] = field(default_factory=list)  # (accepted, drafted), rounds no limit cut short
    verify_passes: int = 0  # verify passes, per request (every round, the cut ones too)
    tokens: int = 0  # tokens committed by the verify passes (the prefill's first tokens excluded)
    seconds: float = 0.0  # wall time of the verify rounds (the prefill excluded)

    @property
    def tau(self) -> float | None:
        """Tokens committed per verify pass (the bonus token counted)."""
        return self.tokens / self.verify_passes if self.verify_passes else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None


def decode_rounds(checkpoint: Path, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, mode: str = "dflash",
                  block_size: int | None = None, stop_token_ids: Sequence[int] | None = None) -> Decoded:
    """Decode `prompts` together (greedy) from `checkpoint`. A round whose committed tokens a
    request's length limit or stop token cut is left out of `rounds` (it says nothing about the
    slots it did not commit) but counted in `tokens` and `verify_passes`."""
    from trtllm_dflash.runtime.checkpoint_runner import checkpoint_steps

    out = Decoded(mode)
    steps = checkpoint_steps(checkpoint, [list(p) for p in prompts], max_new_tokens, mode=mode, block_size=block_size,
                             stop_token_ids=stop_token_ids)
    start = None
    for rec in steps:
        if rec.round == 0:
            start = time.perf_counter()
            continue
        for toks, done, drafted in zip(rec.tokens, rec.finished, rec.drafted):
            out.verify_passes += 1
            out.tokens += len(toks)
            if done is None:
                out.rounds.append((len(toks) - 1, drafted))
    if start is not None:
        out.seconds = time.perf_counter() - start
    return out


def checkpoint_tau(checkpoint: Path, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                   block_size: int | None = None) -> float:
    """Greedy DFlash tau of `checkpoint` on `prompts` with no stop token (every request decodes
    max_new_tokens: the same rounds before and after a change of weights). The quantize stage's
    guardrail measure (quantize/guard.py Measure)."""
    tau = decode_rounds(checkpoint, prompts, max_new_tokens, block_size=block_size, stop_token_ids=[]).tau
    return tau if tau is not None else 1.0
