"""DDTree: a best-first draft tree from one DFlash pass, verified in one target pass.

The drafter gives a distribution q_d for every depth d = 1..D (its mask slots). A prefix
(t_1..t_d) scores sum_i log q_i(t_i). The tree is the `budget` highest-scoring prefixes,
found by best-first search over per-depth ranks: popping a prefix pushes its next sibling
(same depth, next rank) and its first child (next depth, rank 0). A prefix never scores
above its parent, so the result is closed under prefixes, i.e. a tree.

Node 0 is the root (the anchor, the newest committed token); nodes 1..n follow in the
order they were found, so every parent precedes its children. Verification feeds
[root, nodes] at positions start + depth with an ancestor-only mask; `walk` then follows
the target's token at each node down the tree while it matches a child. With the target's
argmax this is greedy decoding; with an independent target sample per node it is exact
sampling (sample-and-match: each emitted token is a sample of p given the emitted prefix).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import torch


@dataclass
class Tree:
    tokens: list[int]  # [1+n] token per node; tokens[0] is the root's (filled by the caller)
    parents: list[int]  # [1+n] parent node; -1 for the root
    depths: list[int]  # [1+n] 0 for the root
    children: list[dict[int, int]]  # per node: token -> child node

    def __len__(self) -> int:
        return len(self.tokens)

    def visibility(self) -> torch.Tensor:
        """[1+n, 1+n] bool: row i is True on i and its ancestors."""
        n = len(self.tokens)
        vis = torch.zeros(n, n, dtype=torch.bool)
        vis[0, 0] = True
        for i in range(1, n):
            vis[i] = vis[self.parents[i]]
            vis[i, i] = True
        return vis


def build_tree(logq: torch.Tensor, budget: int, root_token: int = -1) -> Tree:
    """logq [D, V] log-probabilities per depth; at most `budget` nodes besides the root.
    Zero-probability tokens (-inf, e.g. outside top-k/top-p) are never added."""
    D, V = logq.shape
    k = min(budget, V)
    top_lp, top_tok = logq.float().topk(k, dim=-1)  # [D, k]
    lp, tok = top_lp.tolist(), top_tok.tolist()
    tree = Tree([root_token], [-1], [0], [{}])
    # heap entries: (-score, depth, rank, parent node, parent's score); score = sum of log q
    heap = [(-lp[0][0], 1, 0, 0, 0.0)] if D > 0 and budget > 0 else []
    while heap and len(tree) <= budget:
        neg, depth, rank, parent, base = heapq.heappop(heap)
        if neg == math.inf:  # only zero-probability prefixes are left
            break
        node, token = len(tree), tok[depth - 1][rank]
        tree.tokens.append(token)
        tree.parents.append(parent)
        tree.depths.append(depth)
        tree.children.append({})
        tree.children[parent][token] = node
        if rank + 1 < k:  # next sibling: same parent, this depth's next-ranked token
            heapq.heappush(heap, (-(base + lp[depth - 1][rank + 1]), depth, rank + 1, parent, base))
        if depth < D:  # first child
            heapq.heappush(heap, (neg - lp[depth][0], depth + 1, 0, node, -neg))
    return tree


def walk(tree: Tree, target_tokens: list[int]) -> tuple[list[int], int]:
    """Follow target_tokens[node] (the target's token after each node) while it is a child.
    Returns the accepted path (node ids, root first) and the bonus token."""
    node, path = 0, [0]
    nxt = target_tokens[0]
    while nxt in tree.children[node]:
        node = tree.children[node][nxt]
        path.append(node)
        nxt = target_tokens[node]
    return path, nxt


def chain_outcome(tree: Tree, path: list[int], chain: list[int]) -> tuple[int, int]:
    """(depth, accepted) of the argmax chain `chain` [D] (the drafter's top token per depth) in
    this round: how deep the chain's own nodes reach in the tree, and how many of them lead the
    accepted `path`. Under greedy decoding that is exactly what a chain round from the same
    drafter pass (a block of the same length) would have accepted of its first `depth` slots:
    the target's token after a prefix does not depend on what else the tree holds."""
    node, depth = 0, 0
    for token in chain:
        node = tree.children[node].get(token, -1)
        if node < 0:
            break
        depth += 1
    accepted = 0
    for i, node in enumerate(path[1:]):
        if i >= depth or tree.tokens[node] != chain[i]:
            break
        accepted += 1
    return depth, accepted
