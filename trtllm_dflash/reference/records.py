"""What the decode loop hands its callers: a StepRecord per round, a Generation (tokens + Stats)
per request, and the DecoderProtocol that every decoder (generate.py's Decoder, the engine
backend's, a tensor-parallel rank group's proxy) implements. Kept apart from the loop so that
serving, benches and tests can name these types without the loop's machinery."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch

from trtllm_dflash.policy.decision import Drafts

# trim(requests, lengths, confidence [B, T - 1]) -> each request's drafts to verify, at most its
# length: the round's drafts are drafted, and which prefix of them is verified is chosen from how
# sure the drafter was of each slot (policy/auto.py AutoDraftLength.trim). confidence is the top
# probability of the drafter's distribution at each slot, not the probability of the drawn draft:
# under sampling, a choice that looked at the draw would skew what is accepted (the slot's
# verification would depend on its own token), one that looks at the distribution does not.
Trim = Callable[[list[int], list[int], torch.Tensor], Sequence[int]]


@dataclass
class StepRecord:
    """One round. Round 0 is the prefill (its time is in t_verify); rounds >= 1 are one
    target verify pass each. Lists are aligned with `seq_ids` (the requests that ran)."""

    round: int
    seq_ids: list[int]
    tokens: list[list[int]]  # tokens committed this round (accepted drafts + bonus)
    finished: list[str | None]  # None while running, then "stop" (stop token, kept) or "length"
    drafted: list[int] = field(default_factory=list)  # draft tokens verified this round (0 in round 0)
    t_draft: float = 0.0  # seconds, drafter pass + proposal (tree build), shared by the batch
    t_verify: float = 0.0  # seconds, target pass
    t_overhead: float = 0.0  # seconds, acceptance and bookkeeping
    # A DDTree round: its node budget, and per row (depth of the drafter's argmax chain in the
    # tree, how many of its slots the target accepted): what a chain round of that length would
    # have accepted (greedy), so tree rounds teach a draft policy the chain's acceptance too.
    tree_budget: int = 0  # 0: a chain round (or the prefill)
    chain: list[tuple[int, int]] | None = None
    # A trimmed round (Decoder.step's `trim`): the drafter's block (anchor + drafts it drafted), and
    # per row the top probability of the drafter's distribution at each slot the row could verify
    # (its draft length before the trim; `drafted` says how many of them it verified)
    block: int = 0
    confidence: list[list[float]] | None = None
    # Per row, the log-probability of each committed token under the target (token_rules.py), for
    # the requests admitted with logprobs (None for the others); None when no row asked.
    logprobs: list[list[float] | None] | None = None


@dataclass
class Stats:
    rounds: int = 0  # target verify passes after the prefill
    accepted_per_round: list[int] = field(default_factory=list)  # committed tokens per round (incl. bonus)
    t_prefill: float = 0.0
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_overhead: float = 0.0

    @property
    def tau(self) -> float:
        """Acceptance length: tokens committed per target verify pass (counts the bonus)."""
        return sum(self.accepted_per_round) / len(self.accepted_per_round) if self.accepted_per_round else 0.0


def pooled_tau(gens: Sequence["Generation"]) -> float:
    """tau over several requests: all committed tokens / all verify passes (0 with no rounds).
    Long requests weigh more than in a mean of per-request taus."""
    rounds = sum(g.stats.rounds for g in gens)
    return sum(sum(g.stats.accepted_per_round) for g in gens) / rounds if rounds else 0.0


@dataclass
class Generation:
    tokens: list[int]  # generated ids, without the prompt
    stats: Stats
    finish_reason: str  # "stop" (a stop token, kept) or "length"
    logprobs: list[float] | None = None  # per token, with generate(..., logprobs=True)


class DecoderProtocol(Protocol):
    """The decode loop as its callers drive it (the serving batcher, checkpoint_steps, the benches):
    generate.py's `Decoder`, whatever runners it holds (reference, emulated engine, TensorRT), and the proxy
    of a tensor-parallel rank group (runtime/sharded.py `_RemoteDecoder`). Every
    implementation has exactly these signatures (tests/runtime/test_interfaces.py)."""

    @property
    def running(self) -> int:
        """Requests in the batch."""

    def admit(self, ids: Sequence[int], prompts: Sequence[Sequence[int]], limits: Sequence[int],
              stops: Sequence[Sequence[int]], bad_words: Sequence[Sequence[Sequence[int]] | None] | None = None,
              logprobs: Sequence[bool] | None = None) -> StepRecord:
        """Prefill new requests and add them to the batch. Per request: its bad words (token
        sequences its output never contains) and whether its records carry log-probabilities."""

    def step(self, drafts: Drafts = Drafts()) -> StepRecord:
        """One round for every running request, as `drafts` (policy/decision.py) says: each
        request's draft length (Drafts() drafts block_size - 1; Drafts.of(n) n for every request;
        Drafts.of({request id: n})), the round's tree budget (DDTree decoders: at most the decoder's
        budget, 0 a chain round, None the decoder's) and a trim (chain rounds verify the prefix of
        the drafts trim(requests, lengths, confidence) chooses: see Decoder.step)."""

    def cancel(self, ids: Sequence[int]) -> None:
        """Remove requests from the batch."""

