"""DDTree construction and walk on hand-checkable inputs."""

import itertools
import math
import random

import torch

from trtllm_dflash.reference.ddtree import build_tree, walk


def prefix_of(tree, node):
    path = []
    while node > 0:
        path.append(tree.tokens[node])
        node = tree.parents[node]
    return tuple(reversed(path))


def test_tree_is_the_top_budget_prefixes():
    """Against brute force: the nodes are the `budget` most likely prefixes under the product
    of per-depth marginals (zero-probability tokens excluded), and form a tree."""
    for trial in range(150):
        rng = random.Random(trial)
        D, V, N = rng.randint(1, 4), rng.randint(2, 5), rng.randint(1, 30)
        logq = torch.log_softmax(2 * torch.randn(D, V, generator=torch.Generator().manual_seed(trial)), -1)
        if trial % 3 == 0:
            logq[:, 0] = -math.inf  # e.g. filtered out by top-k
        tree = build_tree(logq, N)
        def score(p):
            return sum(logq[i, t].item() for i, t in enumerate(p))
        every = [p for d in range(1, D + 1) for p in itertools.product(range(V), repeat=d) if score(p) > -math.inf]
        best = sorted((score(p) for p in every), reverse=True)[:N]
        got = [prefix_of(tree, i) for i in range(1, len(tree))]
        assert len(set(got)) == len(got) == len(best)
        # ties may be broken either way, so compare the scores
        assert all(abs(a - b) < 1e-5 for a, b in zip(sorted(map(score, got), reverse=True), best))
        assert all(tree.parents[i] < i and tree.depths[i] == tree.depths[tree.parents[i]] + 1
                   for i in range(1, len(tree)))


def test_visibility_and_walk():
    logq = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.1, 0.2, 0.7]]))
    tree = build_tree(logq, 4, root_token=9)
    # prefixes by probability: (0,) .6, (0,2) .42, (1,) .3, (1,2) .21
    assert [prefix_of(tree, i) for i in range(1, 5)] == [(0,), (0, 2), (1,), (1, 2)]
    vis = tree.visibility()
    assert vis[2].tolist() == [True, True, True, False, False]  # (0,2) sees root, (0,), itself
    assert vis[4].tolist() == [True, False, False, True, True]
    # target tokens after each node [root, (0,), (0,2), (1,), (1,2)]
    assert walk(tree, [1, 5, 5, 2, 7]) == ([0, 3, 4], 7)  # 1 then 2 accepted, bonus 7
    assert walk(tree, [0, 1, 5, 5, 5]) == ([0, 1], 1)  # 0 accepted, 1 is not a child of (0,)
    assert walk(tree, [2, 5, 5, 5, 5]) == ([0], 2)  # nothing accepted
