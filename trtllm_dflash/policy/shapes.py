"""Round cost corrected per shape: what the rounds of each (requests, longest block) took since
start-up, over what VerifyCost models. The start-up fit misses shapes it did not time (larger
batches) and costs it does not model; the drafter's pass is corrected apart from the target's,
since under load they drift apart and a trim pays the drafter for a block it does not verify."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Sequence

from trtllm_dflash.policy.cost import VerifyCost

_MEMO_SHAPES = 4096  # model costs kept (RoundCost.memo)


@dataclass
class RoundCost:
    cost: VerifyCost
    decay: float = 0.9  # each correction is a decayed mean of what rounds of its shape took
    # measured / modelled target part (VerifyCost.verify_s) by (requests, longest drafts + 1)
    correction: dict[tuple[int, int], float] = field(default_factory=dict)
    # measured / start-up drafter pass (VerifyCost.draft_s) by (requests, block drafted)
    draft_correction: dict[tuple[int, int], float] = field(default_factory=dict)
    # verify_scale's index of `correction`: the blocks T seen per batch size, sorted, rebuilt when
    # a shape is added (each key's value changes every round, its keys rarely)
    _by_batch: dict[int, list[int]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _by_batch_size: int = field(default=-1, init=False, repr=False, compare=False)
    # drafter_s's mean draft correction per batch size (dropped when one of its shapes is taught)
    _draft_mean: dict[int, float] = field(default_factory=dict, init=False, repr=False, compare=False)
    # memo=True: what the choice's candidates ask for again and again, kept. The model's own costs
    # (VerifyCost: start-up's fit and shape models, fixed once measured) for good; the corrected
    # verify scales and drafter passes until the next observe_round changes a correction. A round
    # at one request asks for the same ~16 shapes from the decision and again from the trim.
    memo: bool = True
    _model_s: dict[tuple[int, int, int], float] = field(default_factory=dict, init=False, repr=False, compare=False)
    _model_draft_s: dict[tuple[int, int], float] = field(default_factory=dict, init=False, repr=False, compare=False)
    _scale_s: dict[tuple[int, int], float] = field(default_factory=dict, init=False, repr=False, compare=False)
    _drafter_s: dict[tuple[int, int], float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        for B, T in self.cost.timed:  # start from what start-up timed
            self.correction.setdefault((B, T), self.cost.timed_verify_scale(B, T))

    def round_s(self, lengths: Sequence[int], block: int | None = None) -> float:
        """Seconds of a round that verifies these draft lengths, the drafter drafting a block of
        `block` (default max(lengths) + 1): the corrected target part and drafter pass."""
        return self.verify_round_s(lengths) + self.drafter_s(len(lengths), block or max(lengths) + 1)

    def verify_round_s(self, lengths: Sequence[int]) -> float:
        """round_s without the drafter's pass."""
        B, T = len(lengths), max(lengths) + 1
        return self.model_s(B, T, sum(lengths) + B) * self.verify_scale(B, T)

    def counts_s(self, batch: int, T: int, tokens: int, block: int | None = None) -> float:
        """round_s of a round given by its counts (VerifyCost.counts_s): O(1), for the choice's
        candidates (choice.py), which differ from each other in a length or two."""
        return self.model_s(batch, T, tokens) * self.verify_scale(batch, T) + self.drafter_s(batch, block or T)

    def model_s(self, batch: int, T: int, tokens: int) -> float:
        """VerifyCost.counts_s (= verify_s of lengths of these counts), memoised."""
        if not self.memo:
            return self.cost.counts_s(batch, T, tokens)
        key = (batch, T, tokens)
        s = self._model_s.get(key)
        if s is None:
            if len(self._model_s) >= _MEMO_SHAPES:  # packed rounds' token counts vary: keep it small
                self._model_s.clear()
            s = self._model_s[key] = self.cost.counts_s(batch, T, tokens)
        return s

    def uniform_s(self, batch: int, L: int) -> float:
        """round_s([L] * batch) in O(1)."""
        return self.counts_s(batch, L + 1, batch * (L + 1))

    def verify_scale(self, batch: int, T: int) -> float:
        """The correction of the target's part of a round of `batch` requests and longest block T:
        what rounds of that shape took (or start-up timed) over the fit; for a shape neither run
        nor timed, the line between the nearest corrections of its batch size on either side in T
        (the nearest past either end), then between the nearest batch sizes on either side; 1.0
        (the fit) before any. Not 1.0 for every unseen shape: the fit misses a whole batch size
        alike, and an unseen shape that looks cheaper than its neighbours gets run to find out."""
        scale = self.correction.get((batch, T))
        if scale is not None:
            return scale
        return self._kept(self._scale_s, batch, T, self._interpolated_scale)

    def _kept(self, memo: dict, batch: int, T: int, compute) -> float:
        """compute(batch, T), kept in `memo` until the next observed round clears it (memo=False:
        computed every time)."""
        if not self.memo:
            return compute(batch, T)
        value = memo.get((batch, T))
        if value is None:
            value = memo[(batch, T)] = compute(batch, T)
        return value

    def _interpolated_scale(self, batch: int, T: int) -> float:
        """verify_scale of a shape without a correction of its own."""
        if self._by_batch_size != len(self.correction):  # a shape was added: rebuild the index
            self._by_batch = {}
            for b, t in sorted(self.correction):
                self._by_batch.setdefault(b, []).append(t)
            self._by_batch_size = len(self.correction)
        if not self._by_batch:
            return 1.0
        if batch in self._by_batch:
            return self._scale_along_T(batch, T)
        below = max((b for b in self._by_batch if b < batch), default=None)
        above = min((b for b in self._by_batch if b > batch), default=None)
        if below is None or above is None:
            return self._scale_along_T(above if below is None else below, T)
        w = (batch - below) / (above - below)
        return (1 - w) * self._scale_along_T(below, T) + w * self._scale_along_T(above, T)

    def _scale_along_T(self, batch: int, T: int) -> float:
        """verify_scale at a batch size with corrections: the line between its nearest blocks on
        either side of T, or the nearest one."""
        ts = self._by_batch[batch]
        i = bisect.bisect_left(ts, T)
        if i < len(ts) and ts[i] == T:
            return self.correction[(batch, T)]
        if i == 0 or i == len(ts):
            return self.correction[(batch, ts[0 if i == 0 else -1])]
        t0, t1 = ts[i - 1], ts[i]
        c0, c1 = self.correction[(batch, t0)], self.correction[(batch, t1)]
        return c0 + (c1 - c0) * (T - t0) / (t1 - t0)

    def drafter_s(self, batch: int, T: int) -> float:
        """The drafter's pass for a block of T: start-up's (VerifyCost.draft_s), corrected by what
        rounds of this shape took, else by the mean correction of this batch size's blocks."""
        if T <= 1:
            return 0.0
        return self._kept(self._drafter_s, batch, T, self._drafter_pass_s)

    def _drafter_pass_s(self, batch: int, T: int) -> float:
        scale = self.draft_correction.get((batch, T))
        if scale is None:
            scale = self._draft_mean.get(batch)
            if scale is None:  # the batch size's mean, kept until a round of that size teaches a new one
                seen = [v for (b, _), v in self.draft_correction.items() if b == batch]
                scale = self._draft_mean[batch] = sum(seen) / len(seen) if seen else 1.0
        return self.model_draft_s(batch, T) * scale

    def model_draft_s(self, batch: int, T: int) -> float:
        """VerifyCost.draft_s, memoised."""
        if not self.memo:
            return self.cost.draft_s(batch, T)
        s = self._model_draft_s.get((batch, T))
        if s is None:
            s = self._model_draft_s[(batch, T)] = self.cost.draft_s(batch, T)
        return s

    def observe_round(self, lengths: Sequence[int], seconds: float, drafting: float | None = None,
                      block: int | None = None, drafter: bool = True) -> None:
        """A round whose requests verified `lengths` took `seconds` (decode only), `drafting` of
        them the drafter's pass over a block of `block` (default max(lengths) + 1; not measured:
        as modelled). drafter=False: the drafter's pass is not learnt from (it did more than draft
        the block), the rest of the round is."""
        if not lengths or seconds <= 0:
            return
        self._scale_s.clear(), self._drafter_s.clear()  # a correction changes below
        B, T = len(lengths), max(lengths) + 1
        block = block or T
        modelled = self.model_draft_s(B, block)
        if drafter and drafting is not None and block > 1 and drafting > 0 and modelled > 0:  # a fit may model none
            decayed(self.draft_correction, (B, block), drafting / modelled, self.decay)
            self._draft_mean.pop(B, None)
        drafting = self.drafter_s(B, block) if drafting is None else drafting
        verify = self.model_s(B, T, sum(lengths) + B)
        if verify > 0:
            decayed(self.correction, (B, T), max(seconds - drafting, 0.0) / verify, self.decay)


def decayed(table: dict, key, value: float, decay: float) -> None:
    """table[key] <- value the first time, then the decayed mean decay * old + (1 - decay) * value."""
    old = table.get(key)
    table[key] = value if old is None else decay * old + (1 - decay) * value
