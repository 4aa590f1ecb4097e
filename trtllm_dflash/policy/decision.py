"""One round's draft-length decision: the typed value a policy hands Decoder.step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence

# trim(requests, lengths, confidence [B, max(lengths)]) -> the drafts each request verifies
# (reference/records.py Trim; the confidence is a torch tensor)
TrimFn = Callable[[list, list, object], Sequence[int]]


@dataclass(frozen=True)
class Drafts:
    """What one round drafts and verifies, for one decoder's batch.

    length: drafts every request verifies (0: plain decoding); None: the decoder's block_size - 1.
    per_request: {request: drafts}, replacing `length` for the requests it names.
    tree_budget: DDTree decoders: the round's tree nodes; 0 a chain round; None the deployment's.
    trim: chain rounds: once drafted, the prefix of its drafts each request verifies."""

    length: int | None = None
    per_request: Mapping[int, int] | None = None
    tree_budget: int | None = None
    trim: TrimFn | None = None

    @classmethod
    def of(cls, lengths: int | Mapping[int, int] | None, tree_budget: int | None = None,
           trim: TrimFn | None = None) -> "Drafts":
        """From a choice as the policy's models give it: one length, or one per request."""
        if isinstance(lengths, Mapping):
            return cls(None, dict(lengths), tree_budget, trim)
        return cls(lengths, None, tree_budget, trim)

    @classmethod
    def rows(cls, rows: Sequence[int], lengths: Sequence[int], tree_budget: int | None = None,
             trim: TrimFn | None = None) -> "Drafts":
        """One length per request, the requests `rows` in batch order."""
        if len(rows) != len(lengths):
            raise ValueError(f"Drafts.rows: {len(lengths)} lengths for {len(rows)} requests")
        return cls(None, dict(zip(rows, lengths)), tree_budget, trim)

    def wanted(self, rows: Sequence[int], longest: int) -> list[int]:
        """Each row's drafts, before the decoder caps them by the block and the tokens left."""
        default = longest if self.length is None else self.length
        per = self.per_request or {}
        return [per.get(r, default) for r in rows]


class DraftPolicy(Protocol):
    """What the serving loop asks each round for a decoder whose mode the policy sets (`modes`)."""

    modes: tuple[str, ...]

    def decide(self, requests: Sequence[int], concurrency: int, mode: str) -> Drafts:
        """This round's drafts for `requests` (one decoder's batch of `mode`) when `concurrency`
        requests are running in all."""

    def learn(self, rec, seconds: float | None = None) -> None:
        """What a round (a generate.StepRecord) teaches; `seconds`: what it took."""

    def forget(self, request: int) -> None:
        """The request left."""


class FullBlock:
    """The null policy: no decision of its own, every round drafts the decoder's block_size - 1
    (a server without a draft-length policy). Its `modes` is empty, so the loop neither asks it nor
    teaches it; the methods answer anyway."""

    modes: tuple[str, ...] = ()

    def decide(self, requests: Sequence[int], concurrency: int, mode: str) -> Drafts:
        return Drafts()

    def learn(self, rec, seconds: float | None = None) -> None:
        pass

    def forget(self, request: int) -> None:
        pass


FULL_BLOCK = FullBlock()
