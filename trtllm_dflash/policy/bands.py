"""The recipe's concurrency bands (`speculative.draft_len: [{max_concurrency, draft_len}, ...]`).

`band_draft_len` is the one definition of the band rule; the recipe schema, the rules, the
LLM-API deploy and the serving `Bands` policy all call it (tests/policy/test_bands.py fails on a
second one).
"""

from __future__ import annotations

from typing import Sequence

from trtllm_dflash.policy.decision import Drafts


def band_draft_len(bands: Sequence[tuple[int, int]], concurrency: int, block_size: int) -> int:
    """Drafts per round at `concurrency` requests in flight. bands: [(max_concurrency, draft_len)],
    increasing. The first band that covers `concurrency`; past the last, the last band's (a band
    list says how to draft under load, not that load stops drafting); no bands: block_size - 1."""
    for limit, n in bands:
        if concurrency <= limit:
            return n
    return bands[-1][1] if bands else block_size - 1


class Bands:
    """The recipe's static bands as a serving policy: the band's length for every request."""

    modes = ("dflash", "ddtree")  # DDTree: the band's length is the tree's depth

    def __init__(self, bands: Sequence[tuple[int, int]], block_size: int):
        self.bands, self.block_size = list(bands), block_size

    def choose(self, requests, concurrency) -> int:
        return band_draft_len(self.bands, concurrency, self.block_size)

    def decide(self, requests, concurrency: int, mode: str) -> Drafts:
        return Drafts(self.choose(requests, concurrency))

    def learn(self, rec, seconds=None):
        pass

    def forget(self, request):
        pass
