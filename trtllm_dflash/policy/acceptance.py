"""Slot acceptance: the chance that request r accepts draft slot j given the slots before it,
a_rj = sigmoid(b_j + s_r): one slot curve b for every request (the pair's profile) and one shift
s_r per request (how much easier or harder than usual its text is), both learnt online by
stochastic gradient on every slot a round observed."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class AcceptanceConfig:
    # every slot starts here: optimistic, since a slot is observed only when drafted and a
    # pessimistic start would never be tested
    prior: float = 0.9
    request_rate: float = 0.25  # the shifts' learning rate, per observed slot
    # slot j's step is max(slot_rate, 1 / (prior_weight + n_j)) after n_j observations: a running
    # mean at first (rarely drafted late slots must outweigh the prior soon), then tracking
    slot_rate: float = 0.03
    prior_weight: float = 2.0
    decay: float = 0.8  # a request that drafts nothing: its shift falls back by this factor a round


@dataclass
class SlotAcceptance:
    """The curve b (`logits`), its observation counts n (`seen`) and each running request's shift.
    A shift carries what a request's early slots say to its late ones, which a request reaches
    rarely; learning the curve with the shifts keeps the easy requests from inflating it."""

    slots: int  # block_size - 1
    config: AcceptanceConfig = field(default_factory=AcceptanceConfig)
    logits: list[float] = field(default_factory=list)  # b_j, j = 1..slots
    seen: list[float] = field(default_factory=list)  # n_j
    shifts: dict[int, float] = field(default_factory=dict)  # s_r of every running request

    def __post_init__(self):
        p = self.config.prior
        self.logits = self.logits or [math.log(p / (1 - p))] * self.slots
        self.seen = self.seen or [0.0] * self.slots

    @property
    def population(self) -> list[float]:
        """Every slot's acceptance for a request of shift 0 (a new one): sigmoid(b_j)."""
        return [sigmoid(b) for b in self.logits]

    def of(self, request: int) -> list[float]:
        """a_rj for j = 1..slots (a new request: shift 0)."""
        s = self.shifts.get(request, 0.0)
        return [sigmoid(b + s) for b in self.logits]

    def increments(self, request: int) -> list[float]:
        """prod_{j<=k} a_j for k = 1..slots: the expected extra token of drafting slot k."""
        return running_products(self.of(request))

    def curve(self, request: int) -> list[float]:
        """E(L) = 1 + sum_{k<=L} prod_{j<=k} a_j for L = 0..slots: tokens one round commits (the
        target's bonus token counts)."""
        return [1.0 + e for e in itertools.accumulate(self.increments(request), initial=0.0)]

    def totals(self, requests: Sequence[int]) -> list[float]:
        """sum_r E_r(L) over `requests` for L = 0..slots, in one array pass over [requests, slots]
        (a round's decision: no curve per request)."""
        return (len(requests) + np.concatenate([[0.0], np.cumsum(self._products(requests).sum(0))])).tolist()

    def gains(self, requests: Sequence[int], draft_len: int) -> list[float]:
        """E_r(draft_len) of each request."""
        if draft_len == 0:
            return [1.0] * len(requests)
        return (1.0 + self._products(requests)[:, :draft_len].sum(1)).tolist()

    def _products(self, requests: Sequence[int]) -> np.ndarray:
        """[B, slots]: prod_{j<=k} a_rj, every request at once."""
        s = np.fromiter((self.shifts.get(r, 0.0) for r in requests), dtype=np.float64, count=len(requests))
        z = np.asarray(self.logits)[None, :] + s[:, None]
        return np.cumprod(0.5 * (1.0 + np.tanh(0.5 * z)), axis=1)  # sigmoid, without exp's overflow

    def observe(self, request: int, drafted: int, accepted: int) -> None:
        """A round in which `request` verified `drafted` and the target accepted `accepted`: slots
        1..accepted were accepted given their predecessors, slot accepted + 1 rejected. One
        gradient step of the log-likelihood per slot, all at the round's starting shift."""
        s = self.shifts.get(request, 0.0)
        if drafted == 0:
            # Nothing observed: the shift drifts back to the curve, or a request that stopped
            # drafting would keep its low shift for good while the others go on
            self.shifts[request] = self.config.decay * s
            return
        # _step for each observed slot (weight 1), inlined: every request's every verified slot, every
        # round. Every slot is predicted with the shift the round started with: shifted as its own
        # slots go, a request that accepted the first slots of a round looks easier at the late
        # ones, the late slots' curve learns to undo it, and a new round's requests (at their
        # start shifts) get late slots that look harder than they are: `auto` drafted 1-2 short
        # under projected costs (tests/policy/test_auto_projected.py)
        c, b, seen = self.config, self.logits, self.seen
        slot_rate, prior_weight, request_rate = c.slot_rate, c.prior_weight, c.request_rate
        s0 = s
        for j in range(min(drafted, accepted + 1, len(b))):
            x = b[j] + s0
            e = math.exp(-abs(x))
            miss = (1.0 if j < accepted else 0.0) - (1.0 / (1.0 + e) if x >= 0 else e / (1.0 + e))
            n = seen[j]
            b[j] += (slot_rate if slot_rate * (prior_weight + n) >= 1.0 else 1.0 / (prior_weight + n)) * miss
            seen[j] = n + 1.0
            s += request_rate * miss
        self.shifts[request] = s

    def observe_soft(self, request: int, first: int, count: int, label: Callable[[int, float], float]) -> None:
        """Slots first..first + count - 1 were drafted and not verified: each a soft observation,
        its label label(slot, shift) (a stand-in for the target's verdict), weighted by the chance
        that every slot before it is accepted."""
        s, reach = self.shifts.get(request, 0.0), 1.0
        for j in range(first, first + count):
            y = label(j, s)
            s = self._step(j, s, y, reach)
            reach *= y
        self.shifts[request] = s

    def _step(self, j: int, s: float, target: float, weight: float) -> float:
        """One gradient step on slot j's curve and the request's shift s; the new shift."""
        c, b, seen = self.config, self.logits, self.seen
        miss = weight * (target - sigmoid(b[j] + s))
        b[j] += max(c.slot_rate, 1.0 / (c.prior_weight + seen[j])) * miss
        seen[j] += weight
        return s + c.request_rate * miss

    def forget(self, request: int) -> None:
        self.shifts.pop(request, None)


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def running_products(acceptances: Sequence[float]) -> list[float]:
    """prod_{j<=k} a_j for k = 1..len: the chance that slot k and every slot before it is accepted."""
    out, run = [], 1.0
    for a in acceptances:
        run *= a
        out.append(run)
    return out
