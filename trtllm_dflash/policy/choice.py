"""The choice: the draft lengths that maximise the batch's expected tokens per second,
sum_b E_b(L_b) / seconds(L), from each request's expected-tokens curve and a round's cost.

One length for the batch (`best_length`); on a packed runner (each request verifies only its own
tokens) also 0 for the requests whose drafts do not pay for their tokens (`best_or_none`), or any
length per request (`best_prefixes`). A round's decision is O(requests + slots): the batch's
expected tokens come summed (acceptance.SlotAcceptance.totals: one array pass), round costs from
counts; plain Python, where torch's per-op overhead would cost more than the arithmetic.
"""

from __future__ import annotations

import itertools
from typing import Callable, Sequence

Seconds = Callable[[list[int]], float]  # a round's modelled seconds for these per-request lengths
# a round's modelled seconds from its counts: (requests, longest block T, verified tokens in all)
CountSeconds = Callable[[int, int, int], float]


def best_length(totals: Sequence[float], uniform_s: Callable[[int], float]) -> int:
    """The one draft length of highest expected tokens per second: totals[L] = sum_b E_b(L),
    uniform_s(L) the round's seconds when every request drafts L."""
    return max(range(len(totals)), key=lambda L: totals[L] / uniform_s(L))


def best_or_none(totals: Sequence[float], gains_at, counts_s: CountSeconds) -> list[int]:
    """The batch's one best length for every request, except those whose plain decoding (0 drafts)
    makes the batch faster, coldest first; the warmest keeps drafting. One block length a round.
    gains_at(L): each request's E_b(L). O(B log B): a candidate differs from the last by one row."""
    B = len(gains_at(0))
    L = best_length(totals, lambda n: counts_s(B, n + 1, B * (n + 1)))
    lengths = [L] * B
    if L == 0:
        return lengths
    gains = gains_at(L)
    total, tokens = sum(gains), B * (L + 1)
    rate = total / counts_s(B, L + 1, tokens)
    for i in sorted(range(B), key=gains.__getitem__)[:-1]:
        r = (total - gains[i] + 1.0) / counts_s(B, L + 1, tokens - L)
        if r <= rate:
            break
        lengths[i], rate, total, tokens = 0, r, total - gains[i] + 1.0, tokens - L
    return lengths


def best_prefixes(inc: list[list[float]], seconds: Seconds, token_s: Callable[[int, int], float]) -> list[int]:
    """Per row b a prefix length L_b of highest sum_b E_b(L_b) / seconds(lengths), where
    E_b(L) = 1 + sum_{k<=L} inc[b][k-1] and inc [B][K] is each slot's expected extra token
    (non-increasing along a row; 0 past what a row may verify). token_s(B, T): what one more
    verified token costs in a round of B rows and longest block T.

    For each longest length: every row at it (or its own end), then Dinkelbach's iteration: the
    cost is linear in sum_b L_b for that longest, so at the current rate r each row keeps the
    slots whose expected extra token beats r * token_s, and r becomes the rate of that choice (a
    few steps converge). The best over every longest length."""
    B = len(inc)
    gain = [list(itertools.accumulate(row, initial=1.0)) for row in inc]  # [B][K+1]: E_b(L)
    cap = [sum(1 for x in row if x > 0) for row in inc]

    def rate(L: list[int]) -> float:
        return sum(g[n] for g, n in zip(gain, L)) / seconds(L)

    best = [0] * B
    best_rate = rate(best)
    for longest in range(1, max(cap, default=0) + 1):
        L = [min(c, longest) for c in cap]
        r = rate(L)
        for _ in range(4 if B > 1 else 0):  # one row: its prefixes are the candidates
            if r > best_rate:
                best, best_rate = L, r
            threshold = r * token_s(B, longest + 1)
            L = [_prefix_above(row, longest, threshold) for row in inc]
            r_new = rate(L)
            if abs(r_new - r) < 1e-9 * r_new:
                break
            r = r_new
        if r > best_rate:
            best, best_rate = L, r
    return best


def _prefix_above(row: Sequence[float], limit: int, threshold: float) -> int:
    """How many of row's first `limit` entries (non-increasing) exceed threshold."""
    n = 0
    while n < limit and row[n] > threshold:
        n += 1
    return n
