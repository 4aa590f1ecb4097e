"""How many drafts a round verifies: the recipe's concurrency bands, or chosen live.

Every draft length is lossless (the round loop accepts a prefix of the drafts and adds the
target's own token), so a policy only trades acceptance against the verify cost:

  Bands        speculative.draft_len bands: the draft length of the band the number of running
               requests falls in (block_size - 1 without bands). 0 turns speculation off.
  AutoDraftLength   `draft_len: auto`. Per request, a decayed running estimate of the
               conditional acceptance of every draft slot j, a_j = P(slot j accepted | slots
               < j accepted), from what each round accepted, starting from the same estimate
               over every request so far (the pair's profile); the expected tokens a round of
               length L commits for a request, E(L) = 1 + sum_{k=1..L} prod_{j<=k} a_j; and the
               round cost measured when the server starts, t(L) = fixed + per_token x B x (L + 1)
               + (drafter pass if L > 0). It picks the L that maximises sum_b E_b(L) / t(L): the
               tokens per second of the whole batch; every 16th round probes 2L + 1 drafts, so
               that slots past L keep being observed.
The serving batcher asks the policy once per round for every decoder (sampling group) whose
mode the policy sets (`modes`) and reports back what each chain (dflash) round accepted: a DDTree
round's accepted depth is a path through a tree, not a chain's prefix, so it teaches nothing about
a_j. Bands set DDTree's depth too; `auto`'s cost model is a chain's, so DDTree keeps its full depth.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch


class DraftPolicy(Protocol):
    modes: tuple[str, ...]  # the decoding modes whose draft length (DDTree: depth) it sets

    def choose(self, requests: Sequence[int], concurrency: int) -> int:
        """Drafts to verify this round for `requests` (one decoder's batch) when `concurrency`
        requests are running in all."""

    def observe(self, request: int, drafted: int, accepted: int) -> None:
        """A round of `request` verified `drafted` drafts and accepted the first `accepted`."""

    def forget(self, request: int) -> None:
        """The request left."""


class Bands:
    """The recipe's static bands: [(max_concurrency, draft_len), ...], increasing."""

    modes = ("dflash", "ddtree")

    def __init__(self, bands: Sequence[tuple[int, int]], block_size: int):
        self.bands, self.block_size = list(bands), block_size

    def choose(self, requests, concurrency):
        for limit, n in self.bands:
            if concurrency <= limit:
                return n
        return self.bands[-1][1] if self.bands else self.block_size - 1

    def observe(self, request, drafted, accepted):
        pass

    def forget(self, request):
        pass


@dataclass
class VerifyCost:
    """Seconds of one round of B requests verifying L drafts each: fixed + per_token * B * (L + 1)
    + draft (when L > 0). Measured by `measure_cost` when the server starts."""

    fixed: float
    per_token: float
    draft: float

    def round_s(self, batch: int, draft_len: int) -> float:
        return self.fixed + self.per_token * batch * (draft_len + 1) + (self.draft if draft_len > 0 else 0.0)


@dataclass
class AutoDraftLength:
    block_size: int
    cost: VerifyCost
    decay: float = 0.8  # weight of the old estimate per observation (a request's own estimate)
    prior: float = 0.6  # every slot's acceptance before anything was observed
    population_decay: float = 0.98  # the same over every request: where a new request's estimate starts
    probe_every: int = 16  # every n-th choice drafts longer than the best (0: never), see `choose`
    estimates: dict[int, list[float]] = field(default_factory=dict)
    population: list[float] = field(default_factory=list)
    _choices: int = 0
    modes = ("dflash",)  # a class attribute (no annotation): not a dataclass field

    def __post_init__(self):
        self.population = self.population or [self.prior] * (self.block_size - 1)

    def _est(self, request: int) -> list[float]:
        # A request starts from what every request so far accepted (requests live a few dozen
        # rounds: a flat prior would be what most of them decide on).
        return self.estimates.setdefault(request, list(self.population))

    def expected_tokens(self, request: int, draft_len: int) -> float:
        """E(L) = 1 + sum_{k<=L} prod_{j<=k} a_j: tokens one round commits (the bonus counts)."""
        total, run = 1.0, 1.0
        for a in self._est(request)[:draft_len]:
            run *= a
            total += run
        return total

    def best(self, requests) -> int:
        """The draft length of highest expected tokens per second for this batch."""
        best, best_rate = 0, -1.0
        for L in range(self.block_size):
            rate = sum(self.expected_tokens(r, L) for r in requests) / self.cost.round_s(len(requests), L)
            if rate > best_rate:
                best, best_rate = L, rate
        return best

    def choose(self, requests, concurrency):
        """`best`, except every probe_every-th call, which drafts 2 x best + 1: slots past the best
        length are only observed when drafted, and a pessimistic estimate of them would never be
        corrected otherwise (the probe round is lossless like every other)."""
        L = self.best(requests)
        self._choices += 1
        if self.probe_every and self._choices % self.probe_every == 0:
            return min(self.block_size - 1, 2 * L + 1)
        return L

    def observe(self, request, drafted, accepted):
        est, pop = self._est(request), self.population
        # slots 1..accepted were accepted given their predecessors; slot accepted+1 was rejected
        # (a chain round: drafted <= block_size - 1 = len(est))
        for j in range(min(drafted, accepted + 1, len(est))):
            hit = 1.0 if j < accepted else 0.0
            est[j] = self.decay * est[j] + (1 - self.decay) * hit
            pop[j] = self.population_decay * pop[j] + (1 - self.population_decay) * hit

    def forget(self, request):
        self.estimates.pop(request, None)


def measure_cost(decoder_factory, block_size: int, vocab_size: int, batches: Sequence[int] = (1, 4),
                 prompt_len: int = 32, repeats: int = 5) -> VerifyCost:
    """Time rounds of a fresh decoder at a few batch sizes and draft lengths and fit VerifyCost
    by least squares. Each shape's time is the fastest of `repeats` rounds after a warm-up (on a
    shared machine other work only adds time). decoder_factory(max_len) -> a greedy Decoder-like
    object."""
    rows, times = [], []
    g = torch.Generator().manual_seed(0)
    lengths = sorted({0, 1, block_size // 4, block_size // 2, block_size - 1})
    for B in batches:
        for L in lengths:
            decoder = decoder_factory(prompt_len + 4 * block_size * (repeats + 1))
            prompts = torch.randint(0, vocab_size, (B, prompt_len), generator=g).tolist()
            decoder.admit(list(range(B)), prompts, [4 * block_size * (repeats + 1)] * B, [[]] * B)
            decoder.step(L)  # warm-up
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                decoder.step(L)
                best = min(best, time.perf_counter() - t0)
            times.append(best)
            rows.append([1.0, B * (L + 1), 1.0 if L > 0 else 0.0])
    sol = torch.linalg.lstsq(torch.tensor(rows, dtype=torch.float64), torch.tensor(times, dtype=torch.float64)[:, None]).solution
    fixed, per_token, draft = (max(0.0, float(x)) for x in sol[:, 0])
    return VerifyCost(fixed, per_token, draft)
