"""`auto` under the H100 Qwen3-8B recipe's projected round costs chooses what the projection says
is best (issue 52): start-up times batches 1 and 4 (policy/cost.py measure_cost), every round then
costs what the step model says; acceptance is the projection's profile. With the step model as the
cost's shape model (VerifyCost.prior, project/rounds.py) `auto` settles within one draft length of
the projection's best at 1, 16 and 64 requests; with the linear fit alone (what start-up's small
batches set) it settled at 6 where the best is 10 at 64 requests."""

import random
import statistics

import pytest

from trtllm_dflash.perf.loop_costs import projected_cost
from trtllm_dflash.policy.auto import AutoDraftLength
from trtllm_dflash.project.acceptance import resolve
from trtllm_dflash.project.rounds import ProjectedRounds
from trtllm_dflash.recipe import load_recipe, recipes_root
from trtllm_dflash.reference.records import StepRecord


@pytest.fixture(scope="module")
def projected():
    recipe = load_recipe(recipes_root() / "hopper" / "h100-qwen3-8b-fp8.yaml", check_rules=False)
    profile = resolve(recipe, None)
    return ProjectedRounds(recipe, profile), profile, recipe.speculative.block_size


def settle(projected, c: int, prior: bool, rounds: int = 300, output_rounds: int = 64, seed: int = 0) -> list[int]:
    """The round's longest draft length `auto` chooses, round after round, for c requests in a
    closed loop (each leaves after `output_rounds` rounds and a new one joins)."""
    rounds_model, profile, block = projected
    auto = AutoDraftLength(block, projected_cost(rounds_model, block, prior=prior))
    rng, requests, nxt, chosen = random.Random(seed), list(range(c)), c, []
    left = dict.fromkeys(range(c), output_rounds)
    for n in range(1, rounds + 1):
        lengths = auto.decide(requests, c, "dflash").wanted(requests, block - 1)
        tokens, finished = [], []
        for r, L in zip(requests, lengths):
            a = 0
            while a < L and rng.random() < profile.conditional[a]:
                a += 1
            tokens.append([0] * (a + 1))
            left[r] -= 1
            finished.append("length" if left[r] == 0 else None)
        T = max(lengths) + 1
        seconds = rounds_model.prior(c, T, sum(L + 1 for L in lengths)) + rounds_model.draft_prior(c, T)
        auto.learn(StepRecord(n, list(requests), tokens, finished, list(lengths)), seconds)
        chosen.append(T - 1)
        for r, done in zip(list(requests), finished):
            if done:
                requests.remove(r)
                auto.forget(r)
                requests.append(nxt)
                left[nxt], nxt = output_rounds, nxt + 1
    return chosen[rounds // 3:]


def best(projected, c: int) -> int:
    rounds_model, profile, block = projected
    return max(range(1, block), key=lambda K: profile.tau(K) / rounds_model.round_s(c, K))


@pytest.mark.parametrize("c", [1, 16, 64])
def test_auto_settles_within_one_of_the_projections_best(projected, c):
    rounds_model, profile, _ = projected
    chosen = settle(projected, c, prior=True)
    mean, K = statistics.mean(chosen), best(projected, c)
    assert abs(round(mean) - K) <= 1, (mean, K)  # c = 16: 13.0 (best 14; 12-15 are within 0.6% there)
    # and what it runs delivers the best's tokens per second, within 1% (the curve is flat near it)
    rate = lambda k: profile.tau(k) / rounds_model.round_s(c, k)  # noqa: E731
    assert statistics.mean(rate(k) for k in chosen) >= 0.99 * rate(K)


def test_without_the_shape_model_the_fit_of_small_batches_misleads_auto(projected):
    assert best(projected, 64) - statistics.mean(settle(projected, 64, prior=False)) > 2
