"""DDTree under `draft_len: auto`: a round is a tree of some node budget, a chain or plain decoding.

Lossless whatever is chosen; a tree round tells what the drafter's argmax chain would have accepted
(StepRecord.chain), exactly under greedy decoding; the policy trades each option's expected tokens
against its modelled cost and degrades from trees to chains to 0 as verifying gets dearer."""

import math
import random

import pytest
import torch

from trtllm_dflash.policy.acceptance import running_products
from trtllm_dflash.policy.auto import AutoDraftLength
from trtllm_dflash.policy.cost import VerifyCost
from trtllm_dflash.policy.decision import Drafts
from trtllm_dflash.policy.trees import tree_budget_menu
from trtllm_dflash.reference import generate, load_pair
from trtllm_dflash.reference.generate import Decoder, StepRecord


@pytest.mark.parametrize("seed", range(2))
def test_trees_of_any_budget_chains_and_plain_rounds_give_the_greedy_tokens(qwen3_pair, seed):
    target, drafter = load_pair(*qwen3_pair)
    rng = random.Random(30 + seed)
    prompts = [[rng.randrange(255) for _ in range(rng.randint(3, 12))] for _ in range(3)]
    ar = [g.tokens for g in generate(target, None, prompts, 30, mode="ar", stop_token_ids=[])]
    decoder = Decoder(target, drafter, mode="ddtree", ddtree_budget=16, max_len=64)
    rec = decoder.admit([0, 1, 2], prompts, [30] * 3, [[]] * 3)
    out, budgets = [list(t) for t in rec.tokens], set()
    while decoder.running:
        budget = rng.choice([None, 0, 0, 4, 16])
        L = rng.choice([0, 1, 3, None, "each"])
        L = [rng.choice([0, 2, 7]) for _ in range(decoder.running)] if L == "each" else L
        drafts = Drafts.rows(decoder.st.rows, L, budget) if isinstance(L, list) else Drafts.of(L, budget)
        rec = decoder.step(drafts)
        budgets.add(rec.tree_budget)
        assert (rec.chain is not None) == (rec.tree_budget > 0)
        for r, t in zip(rec.seq_ids, rec.tokens):
            out[r] += t
    assert out == ar
    assert 0 in budgets and {4, 16} & budgets  # chain and tree rounds both ran


def test_a_tree_budget_outside_the_decoder_is_refused(qwen3_pair):
    from trtllm_dflash.errors import UserError

    target, drafter = load_pair(*qwen3_pair)
    tree = Decoder(target, drafter, mode="ddtree", ddtree_budget=8, max_len=32)
    tree.admit([0], [[1, 2, 3]], [5], [[]])
    with pytest.raises(UserError, match="tree_budget 9: expected 0..8"):
        tree.step(Drafts(tree_budget=9))
    chain = Decoder(target, drafter, max_len=32)
    chain.admit([0], [[1, 2, 3]], [5], [[]])
    with pytest.raises(UserError, match="only a ddtree decoder"):
        chain.step(Drafts(tree_budget=4))


def test_a_tree_round_reports_what_a_chain_round_would_have_accepted():
    """Same prompts, one round each from the same state: the DDTree round's (chain depth, chain
    accepted) per request against a DFlash round of the whole block (the same drafter pass: the
    block's length changes what the mask slots attend to), cut at that depth."""
    from trtllm_dflash.perf.bench_quant import shipped_pair
    from trtllm_dflash.prompts.sources import heldout_token_prompts

    dirs = shipped_pair()
    if dirs is None:
        pytest.skip("the shipped tiny-pystd pair is not installed")
    target, drafter = load_pair(*dirs, torch.float32)
    prompts = heldout_token_prompts(dirs[0], 8, 48)
    n = len(prompts)
    tree = Decoder(target, drafter, mode="ddtree", ddtree_budget=32, max_len=128)
    tree.admit(list(range(n)), prompts, [40] * n, [[]] * n)
    rec = tree.step()
    depths = [d for d, _ in rec.chain]
    chain = Decoder(target, drafter, max_len=128)
    chain.admit(list(range(n)), prompts, [40] * n, [[]] * n)
    got = chain.step(Drafts(drafter.block_size - 1))
    assert [min(len(t) - 1, d) for t, d in zip(got.tokens, depths)] == [a for _, a in rec.chain]
    assert sum(a for _, a in rec.chain) >= n  # the trained pair accepts: the comparison is not all zeros
    # the tree accepted at least what its chain would have
    assert all(len(t) - 1 >= a for t, (_, a) in zip(rec.tokens, rec.chain))


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _policy(cost, **kw) -> AutoDraftLength:
    return AutoDraftLength(block_size=16, cost=cost, tree_budgets=tree_budget_menu(32), probe_every=0, **kw)


def test_trees_at_low_load_chains_then_plain_decoding_as_verifying_gets_dearer():
    cheap = _policy(VerifyCost(fixed=5e-3, per_token=1e-5, draft=1e-3, per_slot=1e-5, packed=True))
    for n, tokens in ((32, 6.0), (16, 5.0), (8, 4.0)):
        cheap.trees.tokens[n] = tokens
    cheap.slots.logits = [_logit(0.7)] * 15
    assert cheap.choose_tree([0], 1) == (15, 32)  # cheap verify: the biggest tree
    dear = _policy(VerifyCost(fixed=5e-3, per_token=4e-4, draft=1e-3, per_slot=1e-4, packed=True))
    dear.trees.tokens, dear.slots.logits = dict(cheap.trees.tokens), list(cheap.slots.logits)
    lengths, budget = dear.choose_tree(list(range(16)), 16)
    assert budget == 0 and 0 < max(lengths.values()) < 15  # 16 requests: short chains beat any tree
    dearer = _policy(VerifyCost(fixed=1e-3, per_token=5e-3, draft=1e-3, per_slot=5e-3, packed=True))
    dearer.trees.tokens, dearer.slots.logits = dict(cheap.trees.tokens), [_logit(0.3)] * 15
    lengths, budget = dearer.choose_tree(list(range(16)), 16)
    assert budget == 0 and set(lengths.values()) == {0}  # plain decoding


def test_an_unobserved_budget_is_tried_and_a_tree_round_teaches_tokens_cost_and_the_chain():
    cost = VerifyCost(fixed=5e-3, per_token=1e-4, draft=1e-3, per_slot=1e-4, packed=True)
    auto = _policy(cost, prior=0.9)
    # optimistic before any observation
    assert auto.trees.tokens_of(32, running_products(auto.slots.population)) > auto.expected_tokens(0, 15)
    rec = StepRecord(3, [0, 1, 2], [[5, 6, 7], [8], [9, 9]], [None, None, "length"], [32, 32, 32],
                     tree_budget=32, chain=[(5, 2), (4, 0), (6, 1)])
    modelled = cost.round_s(3, 32)
    auto.projected.update(rec.seq_ids)  # not their first drafting round, whose drafter time is not learnt
    auto.learn(rec, seconds=2 * modelled)
    assert auto.trees.tokens[32] == pytest.approx(2.0)  # requests 0 and 1; request 2's last round is cut short
    assert auto.trees.correction[(3, 32)] == pytest.approx(2.0)
    assert auto.trees.round_s(auto.cost, 3, 32) == pytest.approx(2 * modelled)
    # request 0's chain accepted slots 1, 2 and was rejected at 3; request 1's at slot 1
    assert auto.slots.seen[:4] == [2.0, 1.0, 1.0, 0.0]
    # request 0's shift: one gradient step per slot, each slot predicted at the round's starting shift (0)
    s0 = sum(auto.config.acceptance.request_rate * (hit - 0.9) for hit in (1.0, 1.0, 0.0))
    assert auto.slots.shifts[0] == pytest.approx(s0)
    # request 1 misses slot 1, whose logit request 0's hit moved by 0.1 / (prior_weight 2 + 0 seen)
    assert auto.slots.shifts[1] == pytest.approx(-auto.config.acceptance.request_rate * _sigmoid(_logit(0.9) + 0.1 / 2))
    assert 2 not in auto.slots.shifts and auto.rounds.correction == {}  # chain costs are not tree costs
    auto.learn(StepRecord(4, [0], [[1, 2, 3, 4]], [None], [32], tree_budget=32, chain=None))  # sampling: no chain
    assert auto.trees.tokens[32] == pytest.approx(0.9 * 2.0 + 0.1 * 4.0)
