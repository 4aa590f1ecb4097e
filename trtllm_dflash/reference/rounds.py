"""One round of the decode loop for the running batch: draft, verify, accept, feed.

`block_round` is a DFlash round (a drafter block, causal verify) or a plain AR step;
`ddtree_round` drafts a tree and verifies it ancestor-only (ddtree.py). Both take the loop's
`Batch` (the running rows: anchors, positions, pending drafter context), advance it in place, and
return the committed tokens; generate.py's Decoder decides what each round runs and commits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from trtllm_dflash.reference.ddtree import build_tree, chain_outcome, walk
from trtllm_dflash.reference.records import Trim
from trtllm_dflash.reference.runners import PAD, DrafterRunner, ReferenceTarget, RowsFailed, TargetRunner
from trtllm_dflash.reference.token_rules import TokenRules
from trtllm_dflash.reference.verify import probs, rejection_verify, sample, top_ids


@dataclass
class Batch:
    """The loop's state of the running sequences; row b is request rows[b] (and row b of the runners)."""

    rows: list[int]
    anchor: torch.Tensor  # [B] newest committed token; not yet run through the target
    start: torch.Tensor  # [B] its position = committed positions
    ctx: torch.Tensor | None  # [B, Tc, F] target context rows not yet given to the drafter
    ctx_pos: torch.Tensor | None  # [B, Tc] their positions; PAD for padding

    def extend(self, other: "Batch") -> None:
        """Append the rows of another batch (a newly prefilled one) to this batch."""
        self.rows += other.rows
        self.anchor = torch.cat([self.anchor, other.anchor])
        self.start = torch.cat([self.start, other.start])
        if self.ctx is not None:
            n = max(self.ctx.shape[1], other.ctx.shape[1])
            pad = lambda x, v: torch.nn.functional.pad(x, (0, 0, 0, n - x.shape[1]), value=v) if x.dim() == 3 else \
                torch.nn.functional.pad(x, (0, n - x.shape[1]), value=v)  # noqa: E731
            self.ctx = torch.cat([pad(self.ctx, 0.0), pad(other.ctx, 0.0)])
            self.ctx_pos = torch.cat([pad(self.ctx_pos, PAD), pad(other.ctx_pos, PAD)])

    def keep(self, idx: list[int]) -> None:
        sel = torch.tensor(idx, device=self.anchor.device)
        self.rows = [self.rows[i] for i in idx]
        self.anchor, self.start = self.anchor[sel], self.start[sel]
        if self.ctx is not None:
            self.ctx, self.ctx_pos = self.ctx[sel], self.ctx_pos[sel]


def now() -> float:
    return time.perf_counter()


def _draft_logits(target: TargetRunner, drafter: DrafterRunner, st: Batch, T: int) -> torch.Tensor:
    """One drafter pass over [anchor, mask x (T-1)] -> logits of the mask slots [B, T-1, V].
    Hands the pending context rows to the drafter. (`target` is unused: the drafter runner
    holds what it shares with the target; tests substitute this function.)"""
    logits = drafter.draft(st.anchor, st.start, st.ctx, st.ctx_pos, T)
    _handed_over(st)
    return logits


def _handed_over(st: Batch) -> None:
    """The drafter took the pending context rows: none are pending any more."""
    st.ctx, st.ctx_pos = st.ctx[:, :0], st.ctx_pos[:, :0]


def _propose(target: TargetRunner, drafter: DrafterRunner, st: Batch, T: int, sampling, gen,
             confidence: bool = False):
    """Draft tokens [B, T-1], when sampling the distributions q [B, T-1, V] they were drawn
    from, and with `confidence` each slot's top probability [B, T-1] (of the softmax of its
    logits: greedy; of q: sampling; see `Trim`). A drafter that selects its own path (DFlash2,
    runners.PathDrafterRunner) returns draft and q, no confidence; otherwise each slot's token is
    the argmax / a sample of its logits."""
    if getattr(drafter, "selects_path", False):
        draft, q = drafter.draft_path(st.anchor, st.start, st.ctx, st.ctx_pos, T, sampling, gen)
        _handed_over(st)
        return draft, q, None
    dl = _draft_logits(target, drafter, st, T)  # [B, T-1, V]
    if sampling.greedy:
        if not confidence:
            return dl.argmax(-1), None, None
        top = dl.float().softmax(-1).max(-1)  # ties: the first index, as argmax
        return top.indices, None, top.values
    q = probs(dl, sampling)
    return sample(q, gen), q, q.max(-1).values if confidence else None



def block_round(target: TargetRunner, drafter: DrafterRunner | None, st: Batch, lengths: list[int], sampling,
                gen, trim: Trim | None = None, rules: TokenRules | None = None, failed: dict[int, str] | None = None):
    """dflash (a drafter block of max(lengths) + 1) or a plain AR step (every length 0). lengths:
    drafts each row verifies, or, with `trim`, at most verifies. `rules` masks bad words in the
    target's logits, slot by slot, before verification. Returns (committed tokens per row, drafts
    verified per row, per row the confidences of the slots it could verify (its length before the
    trim) or None, t1, t2, the committed tokens' log-probabilities (TokenRules.token_logprobs)).
    `failed`: where the rows whose verify failed go ({row: message}: their results are garbage,
    the caller ends them); without it a failed row fails the round."""
    B, T = len(st.rows), max(lengths) + 1
    q, conf = None, None
    if T > 1:
        draft, q, top = _propose(target, drafter, st, T, sampling, gen, confidence=trim is not None)
        if top is not None:  # asked for, and the drafter gives it (a path drafter does not)
            conf = [row[:L] for row, L in zip(top.tolist(), lengths)]  # every slot the row may verify
            lengths = _trimmed(trim, list(st.rows), lengths, top)
            T = max(lengths) + 1
            draft, q = draft[:, : T - 1], None if q is None else q[:, : T - 1]
    else:  # AR, or the last round of a spec mode (T == 1 only when one token is left)
        draft = st.anchor.new_zeros(B, 0)
    t1 = now()
    own = None if min(lengths) == T - 1 else torch.tensor(lengths, device=st.anchor.device)
    ids = torch.cat([st.anchor[:, None], draft], dim=1)  # [B, T]
    try:
        logits, feats = target.verify(ids, st.start, own)
    except RowsFailed as e:
        if failed is None:
            raise
        failed.update(e.rows)
        if e.result is None:  # every row failed: nothing to verify
            return [[] for _ in st.rows], [0] * B, None, t1, now(), None
        logits, feats = e.result
    t2 = now()
    if rules is not None and rules.bad:  # slot j follows the committed tokens + the row's drafts before it
        dl = draft.tolist()
        logits = rules.mask(st.rows, lambda b: [dl[b][:j] for j in range(lengths[b] + 1)], logits)
    if sampling.greedy:  # greedy_verify's verdict, on the host: one read of [anchor, drafts, the target's argmax]
        best = top_ids(logits)
        acc, new = _greedy_accept(torch.cat([ids, best if best.dtype == ids.dtype else best.to(ids.dtype)], 1).tolist(),
                                  T, lengths)
        # [2, B] in one host-to-device build: each row's committed count (accepted + 1) and bonus
        back = torch.tensor([[a + 1 for a in acc], [n[-1] for n in new]], device=ids.device)
        advance, bonus = back[0], back[1]
    else:
        accepted, bonus = rejection_verify(draft, q, probs(logits, sampling), gen, own)
        # one device-to-host read for every row: [anchor, drafts..., accepted, bonus]
        host = torch.cat([ids, accepted[:, None].to(ids.dtype), bonus[:, None].to(ids.dtype)], 1).tolist()
        acc = [row[T] for row in host]
        new = [row[1 : 1 + row[T]] + [row[T + 1]] for row in host]
        advance = accepted + 1
    lps = None if rules is None else rules.token_logprobs(st.rows, logits, [range(a + 1) for a in acc], new)
    if feats is not None and drafter is not None:  # accepted positions [start, start + a] become drafter context
        _pend(st, feats[:, : max(acc) + 1], advance)
    st.anchor, st.start = bonus, st.start + advance
    return new, lengths, conf, t1, t2, lps


def _greedy_accept(host: list[list[int]], T: int, lengths: list[int]) -> tuple[list[int], list[list[int]]]:
    """verify.greedy_verify on the host rows [anchor, d_1..d_{T-1}, best_0..best_{T-1}]: row b keeps
    the longest prefix of its first lengths[b] drafts equal to the target's argmax, then the
    argmax that follows. (accepted per row, committed tokens per row.)"""
    acc, new = [], []
    for row, L in zip(host, lengths):
        a = 0
        while a < L and row[1 + a] == row[T + a]:
            a += 1
        acc.append(a)
        new.append(row[1 : 1 + a] + [row[T + a]])
    return acc, new



def _trimmed(trim: Trim, rows: list[int], lengths: list[int], confidence: torch.Tensor) -> list[int]:
    """trim's lengths, checked: one per row, each 0..the row's length."""
    got = [int(L) for L in trim(rows, lengths, confidence)]
    if len(got) != len(rows) or any(not 0 <= g <= L for g, L in zip(got, lengths)):
        raise ValueError(f"trim chose {got} for lengths {lengths}: expected one per row, each 0..its length")
    return got


_POSITIONS: dict[tuple[int, torch.device], torch.Tensor] = {}


def _positions(n: int, device: torch.device) -> torch.Tensor:
    """arange(n)[None, :], built once per (n, device): _pend asks for it every round, at one of a
    block's few widths."""
    key = (n, device)
    j = _POSITIONS.get(key)
    if j is None:
        j = _POSITIONS[key] = torch.arange(n, device=device)[None, :]
    return j


def _pend(st: Batch, feats: torch.Tensor, valid: torch.Tensor) -> None:
    """Queue context rows for the drafter: row b's first valid[b] rows of feats [B, n, F], at
    positions start_b + [0, valid_b). They follow what is already pending (a round without a
    drafter pass, draft length 0, leaves its rows pending), each row's valid entries first."""
    n = feats.shape[1]
    j = _positions(n, feats.device)  # [1, n]
    new_pos = torch.where(j < valid[:, None], st.start[:, None] + j, PAD)
    if st.ctx is None or st.ctx.shape[1] == 0:
        st.ctx, st.ctx_pos = feats, new_pos
        return
    # [old pending | new] per row, each row's valid entries first: the new rows go right after the
    # row's `have` pending ones (a gather over the concatenation, no per-row copies)
    have = (st.ctx_pos != PAD).sum(1)  # [B]
    old_w = st.ctx.shape[1]
    width = int((have + valid).max())
    k = torch.arange(width, device=feats.device)[None, :]  # [1, W]
    # [B, W] into the concatenation
    src = torch.where(k < have[:, None], k, old_w + (k - have[:, None]).clamp(0, n - 1))
    keep = k < (have + valid)[:, None]  # [B, W]
    rows = torch.arange(src.shape[0], device=feats.device)[:, None]
    both = torch.cat([st.ctx, feats], 1)[rows, src]  # [B, W, F]
    st.ctx = torch.where(keep[..., None], both, 0.0)
    st.ctx_pos = torch.where(keep, torch.cat([st.ctx_pos, new_pos], 1)[rows, src], PAD)


def ddtree_round(target: ReferenceTarget, drafter: DrafterRunner, st: Batch, T, budget, sampling, gen,
                 rules: TokenRules | None = None):
    B, dev = len(st.rows), st.anchor.device
    dl = _draft_logits(target, drafter, st, T)  # [B, D, V], D = T - 1
    logq = torch.log_softmax(dl.float(), -1) if sampling.greedy else probs(dl, sampling).log()
    trees = [build_tree(logq[b].cpu(), budget, a) for b, a in enumerate(st.anchor.tolist())]
    n = max(len(t) for t in trees)
    tok = torch.zeros(B, n, dtype=torch.long)
    depth = torch.ones(B, n, dtype=torch.long)
    vis = torch.eye(n, dtype=torch.bool).repeat(B, 1, 1)  # padding nodes see only themselves
    for b, tree in enumerate(trees):
        m = len(tree)
        tok[b, :m], depth[b, :m] = torch.tensor(tree.tokens), torch.tensor(tree.depths)
        vis[b, :m, :m] = tree.visibility()
    tok, depth, vis = tok.to(dev), depth.to(dev), vis.to(dev)
    t1 = now()
    logits, feats = target.verify_tree(tok, depth, vis, st.start)
    t2 = now()
    if rules is not None:  # node i follows the committed tokens + the tokens of its ancestors below the root
        logits = rules.mask(st.rows, lambda b: [_ancestors(trees[b], i) for i in range(n)], logits)
    follow = logits.argmax(-1) if sampling.greedy else sample(probs(logits, sampling), gen)  # [B, n]
    top = logq.argmax(-1).tolist()  # [B, D]: the drafter's argmax chain
    new, paths, chain = [], [], []
    for b, (tree, nxt) in enumerate(zip(trees, follow.tolist())):
        path, bonus = walk(tree, nxt)
        new.append([tree.tokens[i] for i in path[1:]] + [bonus])
        paths.append(path)
        chain.append(chain_outcome(tree, path, top[b]))  # (exact under greedy decoding only)
        if path != list(range(len(path))):  # compact accepted nodes' K/V into contiguous slots
            src = torch.tensor(path, device=dev)
            target.compact(b, st.start[b] + src, st.start[b] + torch.arange(len(path), device=dev))
    m = max(len(p) for p in paths)
    idx = torch.tensor([p + [0] * (m - len(p)) for p in paths], device=dev)  # [B, m]
    length = torch.tensor([len(p) for p in paths], device=dev)
    _pend(st, feats.gather(1, idx[..., None].expand(-1, -1, feats.shape[-1])), length)  # the accepted path's rows
    st.anchor = torch.tensor([x[-1] for x in new], device=dev)
    st.start = st.start + length
    lps = None if rules is None else rules.token_logprobs(st.rows, logits, paths, new)
    return new, [len(t) - 1 for t in trees], chain if sampling.greedy else None, t1, t2, lps


def _ancestors(tree, i: int) -> list[int]:
    """The tokens on the path to node i, root excluded (a padding node past the tree: none)."""
    out = []
    while 0 < i < len(tree):
        out.append(tree.tokens[i])
        i = tree.parents[i]
    return out[::-1]
