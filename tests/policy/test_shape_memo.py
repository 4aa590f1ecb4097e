"""RoundCost's memo (policy/shapes.py: the model's costs kept, the corrected ones until the next
learning step) changes no decision: two `auto` policies, memo on and off, run the same seeded
closed loop under the H100 recipe's projected costs (batches of 1 to 6 requests, so rounds are
trimmed, packed rows drop to 0 drafts and unseen shapes are interpolated) and decide, trim and
learn alike, round after round, to the last bit of their corrections."""

import random

import torch

from trtllm_dflash.perf.loop_costs import projected_cost
from trtllm_dflash.policy.auto import AutoDraftLength
from trtllm_dflash.project.acceptance import resolve
from trtllm_dflash.project.rounds import ProjectedRounds
from trtllm_dflash.recipe import load_recipe, recipes_root
from trtllm_dflash.reference.records import StepRecord


def test_memo_changes_no_decision():
    recipe = load_recipe(recipes_root() / "hopper" / "h100-qwen3-8b-fp8.yaml", check_rules=False)
    profile = resolve(recipe, None)
    model, block = ProjectedRounds(recipe, profile), recipe.speculative.block_size
    cost = projected_cost(model, block)
    policies = [AutoDraftLength(block, cost) for _ in range(2)]
    policies[1].rounds.memo = False
    rng, g, requests, nxt = random.Random(0), torch.Generator().manual_seed(0), [0], 1
    for n in range(1, 161):
        c = len(requests)
        decided = [p.decide(requests, c, "dflash") for p in policies]
        lengths = [d.wanted(requests, block - 1) for d in decided]
        assert lengths[0] == lengths[1], n
        L = lengths[0]
        confidence = torch.rand(c, max(max(L), 1), generator=g)
        if decided[0].trim is not None and max(L) > 0:
            trimmed = [d.trim(requests, L, confidence) for d in decided]
            assert trimmed[0] == trimmed[1], n
            L = trimmed[0]
        tokens = []
        for Lb in L:
            a = 0
            while a < Lb and rng.random() < profile.conditional[a]:
                a += 1
            tokens.append([0] * (a + 1))
        T = max(L) + 1
        seconds = model.prior(c, T, sum(x + 1 for x in L)) * rng.uniform(0.8, 1.3) + model.draft_prior(c, T)
        finished = ["length" if rng.random() < 0.15 else None for _ in requests]
        rec = StepRecord(n, list(requests), tokens, finished, list(L), t_draft=model.draft_prior(c, T))
        for p in policies:
            p.learn(rec, seconds)
        for r, done in zip(list(requests), finished):
            if done:
                requests.remove(r)
                for p in policies:
                    p.forget(r)
        while len(requests) < rng.randint(1, 6):
            requests.append(nxt)
            nxt += 1
    assert policies[0].rounds.correction == policies[1].rounds.correction
    assert policies[0].rounds.draft_correction == policies[1].rounds.draft_correction
    assert policies[0].rounds._model_s and not policies[1].rounds._model_s  # the memo was used, and only there
