"""DDTree budgets: a tree round of one of a few node budgets against a chain round.

A tree's value is the mean tokens its rounds of that budget committed per request (optimistic
until observed, so that each budget gets tried), its cost every row verifying budget + 1 tokens
(trees are padded to the largest), corrected by what tree rounds of that shape took."""

from __future__ import annotations

from dataclasses import dataclass, field

from trtllm_dflash.policy.cost import VerifyCost
from trtllm_dflash.policy.shapes import decayed


def tree_budget_menu(budget: int | None) -> tuple[int, ...]:
    """The node budgets `auto` chooses DDTree rounds from: the deployment's, its half and its quarter."""
    if not budget:
        return ()
    return tuple(sorted({n for n in (budget, budget // 2, budget // 4) if n >= 1}, reverse=True))


@dataclass
class TreeBudgets:
    budgets: tuple[int, ...] = ()  # empty: DDTree keeps the deployment's budget and full depth
    decay: float = 0.9  # of the per-budget token means
    tokens: dict[int, float] = field(default_factory=dict)  # budget -> tokens a round commits per request
    correction: dict[tuple[int, int], float] = field(default_factory=dict)  # (requests, budget) -> measured / modelled

    def tokens_of(self, budget: int, chain_increments: list[float]) -> float:
        """Tokens a tree round of `budget` nodes commits per request: the observed mean, or, before
        any, a chain of the whole block plus one (chain_increments: a new request's expected extra
        token per slot)."""
        if budget in self.tokens:
            return self.tokens[budget]
        return 2.0 + sum(chain_increments)

    def round_s(self, cost: VerifyCost, batch: int, budget: int) -> float:
        """Modelled seconds of a tree round: every row verifies budget + 1 tokens, corrected."""
        return cost.round_s(batch, budget) * self.correction.get((batch, budget), 1.0)

    def best(self, cost: VerifyCost, batch: int, chain_increments: list[float]) -> tuple[int, float]:
        """(budget, expected tokens per second of the batch) of the best tree round."""
        rates = {n: batch * self.tokens_of(n, chain_increments) / self.round_s(cost, batch, n) for n in self.budgets}
        best = max(rates, key=rates.get)
        return best, rates[best]

    def observe(self, cost: VerifyCost, batch: int, budget: int, tokens: list[int], seconds: float | None,
                correction_decay: float) -> None:
        """A tree round of `batch` requests and `budget` nodes: the going requests committed
        `tokens` each; `seconds` (None: not learnt from) it took."""
        if seconds is not None and seconds > 0:
            decayed(self.correction, (batch, budget), seconds / cost.round_s(batch, budget), correction_decay)
        if tokens:
            decayed(self.tokens, budget, sum(tokens) / len(tokens), self.decay)
