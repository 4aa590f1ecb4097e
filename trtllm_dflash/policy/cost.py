"""The round cost measured when the server starts: `measure_cost` times rounds of every shape it
can afford and fits `VerifyCost`."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from trtllm_dflash.policy.decision import Drafts


@dataclass
class VerifyCost:
    """Seconds of one round whose requests verify L_b drafts each:
    fixed + per_token * sum_b (L_b + 1) + per_slot * B * (max L + 1) + draft (when any L_b > 0).
    per_token is what each verified token costs (projections, MLP); per_slot what the padded
    [B, max L + 1] part costs (attention). On a runner that is not `packed` every row runs
    max L + 1 tokens, so the two are one term (per_slot = 0) and rows of one round share one L."""

    fixed: float
    per_token: float
    draft: float
    per_slot: float = 0.0
    packed: bool = False
    # the median round start-up timed per (requests, longest drafts + 1) when every request drafted
    # alike: a round's time is not linear in its tokens (kernel tiles), so the policy starts from these
    timed: dict[tuple[int, int], float] = field(default_factory=dict)
    # the drafter's pass in those rounds: a round that drafts a block and verifies fewer of its
    # drafts (the trim) pays the drafter for the whole block
    timed_draft: dict[tuple[int, int], float] = field(default_factory=dict)
    # Shape models, where a deployment has one (a GPU recipe's step model, project/rounds.py): the
    # verify part of a round prior(requests, T, verified tokens) and the drafter's pass
    # draft_prior(requests, T), in seconds. They replace the linear fit as what corrections scale,
    # so shapes start-up never timed (larger batches) follow the model's shape instead of the
    # fit's, which small batches set. None: the fit.
    prior: Callable[[int, int, int], float] | None = None
    draft_prior: Callable[[int, int], float] | None = None

    def round_s(self, batch: int, draft_len: int) -> float:
        """Every one of `batch` requests verifies `draft_len` drafts."""
        return self.lengths_s([draft_len] * batch)

    def lengths_s(self, lengths: Sequence[int]) -> float:
        return self.verify_s(lengths) + (self.draft if max(lengths) > 0 else 0.0)

    def verify_s(self, lengths: Sequence[int]) -> float:
        """The round without its drafter pass: the target verifying these lengths, and the rest."""
        T = max(lengths) + 1
        return self.counts_s(len(lengths), T, sum(L + 1 for L in lengths))

    def counts_s(self, batch: int, T: int, tokens: int) -> float:
        """verify_s of a round of `batch` requests, longest block T, `tokens` verified tokens in all
        (sum of L + 1; a runner that is not packed runs batch x T whatever they are)."""
        if self.prior is not None:
            return self.prior(batch, T, tokens)
        return self.fixed + self.per_token * (tokens if self.packed else batch * T) + self.per_slot * batch * T

    def draft_s(self, batch: int, T: int) -> float:
        """The drafter's pass for `batch` requests and a block of T (0 for T = 1: nothing is
        drafted): as start-up timed it, else a line in the block's tokens (batch x T) through what
        start-up timed (the pass is close to linear in them), else the fit's `draft`."""
        if T <= 1:
            return 0.0
        if (batch, T) in self.timed_draft:
            return self.timed_draft[(batch, T)]
        if self.draft_prior is not None:  # at the scale start-up measured it
            return self.draft_prior(batch, T) * self._draft_prior_scale
        if self._draft_line is None:
            return self.draft
        intercept, slope = self._draft_line
        return max(0.0, intercept + slope * batch * T)

    @functools.cached_property
    def _draft_prior_scale(self) -> float:
        """What start-up timed of the drafter's pass over what draft_prior says (1.0 without timings)."""
        ratios = [s / p for (B, T), s in self.timed_draft.items() if T > 1 and (p := self.draft_prior(B, T)) > 0]
        return sum(ratios) / len(ratios) if ratios else 1.0

    @functools.cached_property
    def _draft_line(self) -> tuple[float, float] | None:
        """(intercept, slope) of the least-squares line through timed_draft in batch x T, once
        (draft_s runs inside every trim); None with fewer than two distinct points."""
        points = [(B * t, s) for (B, t), s in self.timed_draft.items() if t > 1]
        if len({x for x, _ in points}) < 2:
            return None
        mx, my = sum(x for x, _ in points) / len(points), sum(y for _, y in points) / len(points)
        slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
        return my - slope * mx, slope

    def timed_verify_scale(self, batch: int, T: int) -> float | None:
        """What start-up timed for a uniform round of `batch` requests and block T, less the
        drafter's share, over verify_s (None: start-up did not time that shape)."""
        seconds = self.timed.get((batch, T))
        if seconds is None:
            return None
        return max(seconds - self.timed_draft.get((batch, T), 0.0), 0.0) / self.verify_s([T - 1] * batch)


def measure_cost(decoder_factory, block_size: int, vocab_size: int, batches: Sequence[int] = (1, 4),
                 prompt_len: int = 32, repeats: int = 5) -> VerifyCost:
    """Time rounds of a fresh decoder at a few batch sizes and every draft length and fit VerifyCost
    by least squares. Each shape's time is the fastest of `repeats` rounds after a warm-up (on a
    shared machine other work only adds time); the median of each uniform shape is kept as is
    (VerifyCost.timed). decoder_factory(max_len) -> a greedy Decoder-like object; one whose
    `packed` is True is also timed with half its rows at 0 drafts, which separates per_token from
    per_slot."""
    g = torch.Generator().manual_seed(0)
    packed = bool(getattr(decoder_factory(prompt_len + 1), "packed", False))
    shapes = [[L] * B for B in batches for L in range(block_size)]
    if packed:
        shapes += [[L, 0] * (max(batches) // 2) for L in sorted({1, block_size // 4, block_size // 2, block_size - 1})]
    rows, times, timed, timed_draft = [], [], {}, {}
    for shape in shapes:
        took, drafting = _time_shape(decoder_factory, shape, block_size, vocab_size, prompt_len, repeats, g)
        times.append(min(took))
        B, T = len(shape), max(shape) + 1
        if len(set(shape)) == 1:
            timed[(B, T)] = sorted(took)[len(took) // 2]
            timed_draft[(B, T)] = sorted(drafting)[len(drafting) // 2]
        tokens = sum(L + 1 for L in shape) if packed else B * T
        rows.append([1.0, tokens, 1.0 if T > 1 else 0.0] + ([B * T] if packed else []))
    sol = torch.linalg.lstsq(torch.tensor(rows, dtype=torch.float64),
                             torch.tensor(times, dtype=torch.float64)[:, None]).solution
    fixed, per_token, draft, *per_slot = (max(0.0, float(x)) for x in sol[:, 0])
    return VerifyCost(fixed, per_token, draft, per_slot[0] if packed else 0.0, packed, timed, timed_draft)


def _time_shape(decoder_factory, shape: list[int], block_size: int, vocab_size: int, prompt_len: int, repeats: int,
                g: torch.Generator) -> tuple[list[float], list[float]]:
    """(seconds of each timed round, its drafter's seconds) of `repeats` rounds of `shape` after a
    warm-up, on a fresh decoder of random prompts."""
    B, n = len(shape), 4 * block_size * (repeats + 1)
    decoder = decoder_factory(prompt_len + n)
    prompts = torch.randint(0, vocab_size, (B, prompt_len), generator=g).tolist()
    decoder.admit(list(range(B)), prompts, [n] * B, [[]] * B)
    drafts = Drafts.rows(range(B), shape)
    decoder.step(drafts)  # warm-up
    took, drafting = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        drafting.append(decoder.step(drafts).t_draft)
        took.append(time.perf_counter() - t0)
    return took, drafting
