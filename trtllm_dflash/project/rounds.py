"""A recipe's projected rounds (stepmodel.py), as the round loop and its policy ask for them:
`ProjectedRounds.round_s(c, K)` is the DFlash server's round of c requests drafting K each on the
recipe's GPU, at the sweep's context (its prompt + half its output, as `project` projects);
`prior` and `draft_prior` are the shape models the `auto` policy scales by what it measures
(policy/cost.py VerifyCost.prior), so that the shapes start-up never timed follow the step model."""

from __future__ import annotations

import functools

from trtllm_dflash.project.acceptance import AcceptanceProfile
from trtllm_dflash.project.rates import Assumptions
from trtllm_dflash.project.stepmodel import Deployment, StepModel


class ProjectedRounds:
    def __init__(self, recipe, profile: AcceptanceProfile, assumptions: Assumptions = Assumptions()):
        self.model, self.profile = StepModel(Deployment.from_recipe(recipe), assumptions), profile
        sw = recipe.sweep
        self.ctx = sw.input_len + sw.output_len // 2
        self.k_max = min(recipe.speculative.block_size - 1, profile.max_draft_len)

    def _tau(self, K: int) -> float:
        return self.profile.tau(min(K, self.k_max)) if K else 1.0

    @functools.lru_cache(maxsize=None)
    def round_s(self, c: int, K: int) -> float:
        """One round of c requests verifying K drafts each (K = 0: the server's plain round)."""
        K = min(K, self.k_max)
        return self.model.step(c, K, self._tau(K), self.ctx, plain=False).seconds

    @functools.lru_cache(maxsize=None)
    def prior(self, batch: int, T: int, tokens: int) -> float:
        """The verify part of a round (all but the drafter's pass) of `batch` requests, block T,
        `tokens` verified tokens in all (rows of different lengths: their mean)."""
        K = min(T - 1, self.k_max)
        step = self.model.step(batch, K, self._tau(K), self.ctx, plain=False)
        q = max(1, round(tokens / batch))
        if q == K + 1:
            return step.seconds - step.drafter.seconds
        return self.model.verify_pass(batch, q, self.ctx).seconds + step.t_overhead

    @functools.lru_cache(maxsize=None)
    def draft_prior(self, batch: int, T: int) -> float:
        """The drafter's pass over a block of T for `batch` requests."""
        K = min(T - 1, self.k_max)
        return self.model.drafter_pass(batch, K, self.ctx, self._tau(K)).seconds if K else 0.0
