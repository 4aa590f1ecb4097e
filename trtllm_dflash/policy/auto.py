"""`draft_len: auto`: the draft lengths of highest expected tokens per second, chosen each round.

It composes the policy's models: slot acceptance (acceptance.py) gives each request's expected
tokens E_r(L) = 1 + sum_{k<=L} prod_{j<=k} a_rj; the round cost measured at start-up and
corrected per shape (cost.py, shapes.py) gives a round's seconds; the choice (choice.py) picks one
length for the batch, or per request on a packed runner; the confidence trim (trim.py) cuts a
drafted block to the prefix worth verifying; DDTree decoders weigh tree budgets against the chain
round (trees.py). Its hyperparameters are one frozen `AutoConfig`; what it learns lives in the
models it holds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import torch

from trtllm_dflash.policy import choice
from trtllm_dflash.policy.acceptance import AcceptanceConfig, SlotAcceptance, running_products
from trtllm_dflash.policy.cost import VerifyCost
from trtllm_dflash.policy.decision import Drafts
from trtllm_dflash.policy.shapes import RoundCost
from trtllm_dflash.policy.trees import TreeBudgets
from trtllm_dflash.policy.trim import ConfidenceTrim, TrimConfig

# AutoConfig.of's flat names for the trim's settings
_TRIM_NAMES = {"trim_batch": "batch", "confidence_shift": "shift", "confidence_rate": "rate",
               "confidence_weight_rate": "weight_rate"}


@dataclass(frozen=True)
class AutoConfig:
    """What `auto` is told, not what it learns."""

    acceptance: AcceptanceConfig = field(default_factory=AcceptanceConfig)
    trim: TrimConfig = field(default_factory=TrimConfig)
    # every n-th choice drafts 2L + 1 so that slots past L get observed (0: never; the shifts and
    # the optimistic curve already make easy requests draft long and observe late slots)
    probe_every: int = 0
    mixed: bool = False  # packed runners: any length per request (True) or the best one length, or 0
    correction_decay: float = 0.9  # of the per-shape round-cost corrections
    tree_budgets: tuple[int, ...] = ()  # DDTree rounds' node budgets (trees.tree_budget_menu)
    tree_decay: float = 0.9  # of the per-budget tree token means

    @classmethod
    def of(cls, **flat) -> "AutoConfig":
        """From flat names: AcceptanceConfig's, AutoConfig's own, and trim_batch,
        confidence_shift, confidence_rate, confidence_weight_rate for TrimConfig's."""
        acceptance = {k: flat.pop(k) for k in [f.name for f in dataclasses.fields(AcceptanceConfig)] if k in flat}
        trim = {_TRIM_NAMES[k]: flat.pop(k) for k in list(_TRIM_NAMES) if k in flat}
        own = {f.name for f in dataclasses.fields(cls)} - {"acceptance", "trim"}
        unknown = sorted(set(flat) - own)
        if unknown:
            raise TypeError(f"AutoConfig.of: unknown setting {unknown[0]!r}")
        return cls(AcceptanceConfig(**acceptance), TrimConfig(**trim), **flat)


class AutoDraftLength:
    """A DraftPolicy: `decide` each round, `learn` from each round, `forget` a request that left."""

    modes = ("dflash", "ddtree")

    def __init__(self, block_size: int, cost: VerifyCost, config: AutoConfig | None = None, **hyperparameters):
        self.block_size, self.cost = block_size, cost
        self.config = config if config is not None else AutoConfig.of(**hyperparameters)
        c, K = self.config, block_size - 1
        self.slots = SlotAcceptance(K, c.acceptance)
        self.rounds = RoundCost(cost, c.correction_decay)
        self.confidence = ConfidenceTrim(K, c.trim)
        self.trees = TreeBudgets(c.tree_budgets, c.tree_decay)
        # the running requests whose prompt the drafter has projected: a round with a drafter
        # pass ran since they joined
        self.projected: set[int] = set()
        self._choices = 0

    # ---- deciding

    def decide(self, requests: Sequence[int], concurrency: int, mode: str) -> Drafts:
        """DraftPolicy.decide: `choose_tree` for DDTree decoders, `choose` for chain ones, and the
        trim for rounds of at most TrimConfig.batch requests."""
        trim = self.trimmer(len(requests))
        if mode == "ddtree":
            lengths, budget = self.choose_tree(requests, concurrency)
            return Drafts.of(lengths, budget, trim)
        return Drafts.of(self.choose(requests, concurrency), None, trim)

    def expected_tokens(self, request: int, draft_len: int) -> float:
        return self.slots.curve(request)[draft_len]

    def round_s(self, lengths: Sequence[int], block: int | None = None) -> float:
        return self.rounds.round_s(lengths, block)

    def best(self, requests) -> int:
        """The one draft length of highest expected tokens per second for this batch."""
        B = len(requests)
        return choice.best_length(self.slots.totals(requests), lambda L: self.rounds.uniform_s(B, L))

    def best_or_none(self, requests) -> list[int]:
        return choice.best_or_none(self.slots.totals(requests), lambda L: self.slots.gains(requests, L),
                                   self.rounds.counts_s)

    def best_per_request(self, requests) -> list[int]:
        """Each request's draft length, jointly of highest expected tokens per second (packed runners)."""
        if not requests:
            return []
        return choice.best_prefixes([self.slots.increments(r) for r in requests], self.rounds.round_s, self._token_s)

    def _token_s(self, batch: int, T: int) -> float:
        """What one more verified token costs in a round of this shape, corrected."""
        return self.cost.per_token * self.rounds.verify_scale(batch, T)

    def choose(self, requests, concurrency) -> int | dict[int, int]:
        """`best` (one length) or, on a packed runner, `best_or_none` / `best_per_request`
        ({request: length}); with probe_every, every n-th call drafts 2L + 1 (lossless like every
        other round) so that slots past the best length are observed."""
        self._choices += 1
        every = self.config.probe_every
        probe = bool(every) and self._choices % every == 0
        stretch = (lambda L: min(self.block_size - 1, 2 * L + 1)) if probe else (lambda L: L)
        if not self.cost.packed:
            return stretch(self.best(requests))
        if len(requests) == 1:
            lengths = [self.best(requests)]
        elif self.config.mixed:
            lengths = self.best_per_request(requests)
        else:
            lengths = self.best_or_none(requests)
        return {r: stretch(L) for r, L in zip(requests, lengths)}

    def choose_tree(self, requests, concurrency) -> tuple[int | dict[int, int] | None, int | None]:
        """A DDTree decoder's round: (the tree's depth or the chain's lengths, tree budget): the
        budget of highest expected tokens per second, or a chain round (budget 0) when no tree
        beats it; without tree_budgets, the deployment's trees at full depth (None, None)."""
        if not self.trees.budgets or not requests:
            return None, None
        chain = self.choose(requests, concurrency)
        lengths = [chain.get(r, 0) for r in requests] if isinstance(chain, dict) else [chain] * len(requests)
        chain_rate = sum(self.expected_tokens(r, L) for r, L in zip(requests, lengths)) / self.round_s(lengths)
        best, rate = self.trees.best(self.cost, len(requests), running_products(self.slots.population))
        if rate > chain_rate:
            return self.block_size - 1, best
        return chain, 0

    def trimmer(self, batch: int):
        """`trim` for rounds of at most TrimConfig.batch requests, else None."""
        return self.trim if batch <= self.config.trim.batch else None

    def trim(self, requests: list[int], lengths: list[int], confidence: torch.Tensor) -> list[int]:
        """Decoder.step's `trim`: the block is drafted (max(lengths) + 1, as `choose` chose); each
        request verifies the prefix of its drafts (at most its length) that maximises the batch's
        expected tokens per second, its acceptance from its slots' confidences [B, max(lengths)].
        The drafter's pass is paid whatever is verified."""
        B, longest = len(requests), max(lengths)
        inc = []  # [B, longest]: each slot's chance that it and the slots before it hold; 0 past a row's length
        for r, row, L in zip(requests, confidence.tolist(), lengths):  # a few rows: plain floats, one read
            shift, run, out = self.slots.shifts.get(r, 0.0), 1.0, []
            for j, c in enumerate(row[:L]):
                run *= self.confidence.slot_acceptance(j, c, shift)[1]
                out.append(run)
            inc.append(out + [0.0] * (longest - L))
        drafter = self.rounds.drafter_s(B, longest + 1)
        return choice.best_prefixes(inc, lambda L: self.rounds.verify_round_s(L) + drafter, self._token_s)

    # ---- learning

    def learn(self, rec, seconds: float | None = None) -> None:
        """A round (a generate.StepRecord) and, with `seconds`, what it took. A request's last round
        commits only what it had left, so only the requests that go on teach acceptance. The
        drafter's pass is not learnt from in the first drafted round after a request joined: the
        drafter then also projects that request's prompt, a cost of its arrival."""
        going = [i for i, done in enumerate(rec.finished) if done is None]
        drafted = bool(rec.tree_budget) or rec.block > 1 or max(rec.drafted, default=0) > 0
        joined = drafted and not self.projected.issuperset(rec.seq_ids)
        if drafted:
            self.projected.update(rec.seq_ids[i] for i in going)
        if rec.tree_budget:
            self._learn_tree(rec, going, None if joined else seconds)
            return
        if seconds is not None:  # a trimmed round paid the drafter for its block, not for what it verified
            self.rounds.observe_round(rec.drafted, seconds, rec.t_draft or None, rec.block or None, drafter=not joined)
        for i in going:
            request, verified, accepted = rec.seq_ids[i], rec.drafted[i], len(rec.tokens[i]) - 1
            self.slots.observe(request, verified, accepted)
            if rec.confidence is not None:
                self.confidence.observe(rec.confidence[i][:verified], accepted, self.slots.shifts.get(request, 0.0))
                if accepted == verified:
                    self.observe_unverified(request, verified, rec.confidence[i][verified:])

    def _learn_tree(self, rec, going: list[int], seconds: float | None) -> None:
        """A tree round teaches its budget's tokens and cost and, through StepRecord.chain (under
        greedy decoding a tree holds the drafter's argmax chain), the chain estimates."""
        tokens = [len(rec.tokens[i]) for i in going]
        self.trees.observe(self.cost, len(rec.seq_ids), rec.tree_budget, tokens, seconds, self.config.correction_decay)
        for i in going if rec.chain is not None else ():
            self.slots.observe(rec.seq_ids[i], *rec.chain[i])

    def observe_unverified(self, request: int, first: int, confidence: Sequence[float]) -> None:
        """A trimmed round in which `request` accepted every draft it verified (`first` of them)
        and left the next len(confidence) slots unverified. The trim keeps the slots the drafter is
        sure of, so learning from verified slots alone would overrate long blocks; given its
        confidence a slot's trim is at random, so the trim's acceptance stands in for the target's
        verdict (SlotAcceptance.observe_soft)."""
        def label(j: int, shift: float) -> float:
            return self.confidence.slot_acceptance(j, confidence[j - first], shift)[1]

        self.slots.observe_soft(request, first, len(confidence), label)

    def forget(self, request: int) -> None:
        self.slots.forget(request)
        self.projected.discard(request)

