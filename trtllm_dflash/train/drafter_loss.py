"""The drafter's training forward and loss: the published recipe, in plain PyTorch.

Recipe (DFlash paper as reproduced by the community; z-lab has not released its code):
- data: the target's own greedy continuations of prompts ("target alignment"), with a
  loss mask on the generated tokens (train/data.py writes them);
- the target is frozen. One no-grad target pass per sequence gives the context features
  F = concat of the outputs of `target_layer_ids` at every position  # [N, S, n*H]
- per sequence, up to K distinct random anchors a (sorted) among positions with
  loss_mask = 1 and a <= S - B; block k is [x_a, MASK x (B-1)] at positions a .. a+B-1,
  embedded with the target's embedding;
- the drafter runs all blocks of a sequence at once. A block anchored at a sees the
  context keys of positions strictly before a (the anchor's own features do not exist yet
  at inference) and the keys of its own block; nothing of the other blocks;
- slot k (k = 1..B-1) predicts x_{a+k} (same position, no shift) through the target's
  LM head; weight valid * loss_mask[a+k] * exp(-(k-1)/gamma); loss = sum(w*CE)/sum(w).

DFlash2 (`DrafterShape.variant = "dflash2"`; z-lab has not published how it trains one, so
this part is ours): the convolutions run inside each block (the blocks are the conv's
sequences, as at inference); the selector is trained teacher-forced: at slot k its
predecessor is the true x_{a+k-1} (x_a for slot 1), its candidates are the top-k of the
draft logits (no gradient through the choice), and its loss is the cross-entropy of the
pairwise scores over the candidates against x_{a+k}, on slots whose label is among them,
with the same slot weights; loss = draft CE + selector_weight * selector CE. Along an
accepted prefix the true predecessors are exactly the ones the selector chose, so the
teacher-forced leading-correct count is the greedy acceptance of the selector's path.

The training forward calls the DFlashDraft's own submodules (fc, hidden_norm, each
layer's projections and norms, rope, norm): the trained module *is* the inference module,
and `tests/train/test_train_drafter.py` checks that one block of the training forward
equals `DFlashDraft.forward` with its KV cache.

Attention layout: instead of one dense [K*B, S + K*B] mask (K*B*(K*B) wasted scores),
every block attends over its own key list [context (S) ; own block (B)] with the
visibility above, the context K/V computed once per sequence and shared by its blocks
(block_attention). Same maths, (S+B)/(S+K*B) of the work, no copies of the context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trtllm_dflash.reference.cache import KVCache
from trtllm_dflash.reference.config import DraftConfig
from trtllm_dflash.reference.draft import DFlashDraft, key_limit
from trtllm_dflash.reference.target import Target, apply_rope


def freeze(target: Target) -> Target:
    """The target is never trained: no gradients into its layers, embedding or LM head."""
    return target.requires_grad_(False).eval()


@torch.no_grad()
def target_features(target: Target, ids: torch.Tensor, layer_ids) -> torch.Tensor:
    """Outputs of `layer_ids` for every position of ids [N, S] (causal): [N, S, n*H]."""
    N, S = ids.shape
    cache = KVCache(target.cfg.num_layers, N, target.cfg.num_kv_heads, S, target.cfg.head_dim, target.dtype, ids.device)
    pos = torch.arange(S, device=ids.device).expand(N, -1)
    mask = torch.ones(S, S, dtype=torch.bool, device=ids.device).tril()[None, None]
    _, feats = target(ids, pos, cache, S, mask, capture=tuple(layer_ids), logits_at=pos[:, :1])
    return feats


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, block_size: int, gen: torch.Generator):
    """Up to `num_anchors` distinct anchors per row of loss_mask [N, S], sorted, uniform
    among positions a with loss_mask[a] = 1 and a <= S - block_size.
    Returns anchors [N, K] (long; invalid entries 0) and valid [N, K] (bool)."""
    N, S = loss_mask.shape
    ok = loss_mask.bool().clone()
    ok[:, S - block_size + 1 :] = False
    score = torch.rand(N, S, generator=gen).to(ok.device)  # gen is a CPU generator
    score = torch.where(ok, score, -1.0)  # candidates first, in random order
    K = min(num_anchors, S)
    top, idx = score.topk(K, dim=1)
    valid = top >= 0
    anchors = torch.where(valid, idx, S)  # invalid ones sort last
    anchors, order = anchors.sort(dim=1)
    valid = valid.gather(1, order)
    return torch.where(valid, anchors, 0), valid


def block_visibility(cfg: DraftConfig, anchors: torch.Tensor, valid: torch.Tensor, S: int):
    """Per drafter layer: (ctx [N, K, B, S], own [1, 1, B, B]) bool, True = visible.

    Context key s is visible to the block anchored at a iff s < a; own-block keys are all
    candidates; within those, the inference drafter's rule (reference.draft.key_limit)
    applies: causal layers hide keys ahead of the query, sliding layers keys beyond the
    window. Invalid blocks see only their own block (they carry no loss; this keeps the
    softmax finite)."""
    N, K = anchors.shape
    B = cfg.block_size
    dev = anchors.device
    a = anchors[:, :, None, None]  # [N, K, 1, 1]
    s = torch.arange(S, device=dev)
    j = torch.arange(B, device=dev)
    ctx = ((s < a) & valid[:, :, None, None]).expand(-1, -1, B, -1)  # [N, K, B, S]
    out = []
    for causal, kind in zip(cfg.causal, cfg.layer_types):
        limit_ctx = key_limit(a + j[:, None], s, causal, kind, cfg.sliding_window)  # [N, K, B, S] or None
        limit_own = key_limit(j[:, None], j, causal, kind, cfg.sliding_window)  # [B, B] (slots: same offsets)
        c = ctx if limit_ctx is None else ctx & limit_ctx
        own = torch.ones(B, B, dtype=torch.bool, device=dev) if limit_own is None else limit_own
        out.append((c, own[None, None]))  # own: [1, 1, B, B]
    return out


def block_attention(q, kc, vc, kb, vb, vis_ctx, vis_own) -> torch.Tensor:
    """Softmax attention of every block over [context ; own block], context K/V shared.

    q [N, K, B, h, D]; kc, vc [N, S, hkv, D]; kb, vb [N, K, B, hkv, D];
    vis_ctx [N, K, B, S]; vis_own [1, 1, B, B]  ->  [N, K, B, h, D]
    Query head i reads KV head i // (h / hkv), as SDPA's enable_gqa does."""
    N, K, B, h, D = q.shape
    hkv = kc.shape[2]
    g = h // hkv
    qg = q.permute(0, 3, 1, 2, 4).reshape(N, hkv, g, K, B, D) * D**-0.5  # [N, hkv, g, K, B, D]
    kc_ = kc.permute(0, 2, 1, 3)[:, :, None]  # [N, hkv, 1, S, D]
    vc_ = vc.permute(0, 2, 1, 3)[:, :, None]
    kb_ = kb.permute(0, 3, 1, 2, 4)[:, :, None]  # [N, hkv, 1, K, B, D]
    vb_ = vb.permute(0, 3, 1, 2, 4)[:, :, None]
    s_ctx = (qg.reshape(N, hkv, g, K * B, D) @ kc_.transpose(-1, -2)).view(N, hkv, g, K, B, -1)  # [.., K, B, S]
    s_own = qg @ kb_.transpose(-1, -2)  # [N, hkv, g, K, B, B]
    S = s_ctx.shape[-1]
    scores = torch.cat([s_ctx, s_own], dim=-1).float()  # [N, hkv, g, K, B, S+B]
    vis = torch.cat([vis_ctx, vis_own.expand(N, K, B, B)], dim=-1)[:, None, None]  # [N, 1, 1, K, B, S+B]
    p = scores.masked_fill(~vis, float("-inf")).softmax(-1).to(q.dtype)
    o = (p[..., :S].reshape(N, hkv, g, K * B, S) @ vc_).view(N, hkv, g, K, B, D) + p[..., S:] @ vb_
    return o.reshape(N, h, K, B, D).permute(0, 2, 3, 1, 4)  # [N, K, B, h, D]


def draft_blocks(
    drafter: DFlashDraft,
    embed: torch.nn.Embedding,
    feats: torch.Tensor,  # [N, S, n*H] context features
    ids: torch.Tensor,  # [N, S] tokens
    anchors: torch.Tensor,  # [N, K]
    valid: torch.Tensor,  # [N, K]
) -> torch.Tensor:  # [N, K, B, H] final-normed drafter output
    """All blocks of every sequence in one pass (see the module doc for the masks)."""
    cfg = drafter.cfg
    N, S = ids.shape
    K, B = anchors.shape[1], cfg.block_size
    h, hkv, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    dev = ids.device
    blk_ids = torch.full((N, K, B), cfg.mask_token_id, dtype=torch.long, device=dev)
    blk_ids[:, :, 0] = ids.gather(1, anchors)
    blk_pos = (anchors[:, :, None] + torch.arange(B, device=dev)).reshape(N, K * B)  # [N, KB]
    x = drafter.embed_scale(embed(blk_ids)).reshape(N * K, B, -1)  # [NK, B, H]: one row per block
    ctx = drafter.hidden_norm(drafter.fc(drafter.fuse(feats)))  # [N, S, H]
    rope_blk = drafter.rope(blk_pos, x.dtype)
    rope_ctx = drafter.rope(torch.arange(S, device=dev).expand(N, -1), x.dtype)
    for layer, (vis_ctx, vis_own) in zip(drafter.layers, block_visibility(cfg, anchors, valid, S)):
        at = layer.self_attn

        def attention(a: torch.Tensor) -> torch.Tensor:  # [NK, B, H] -> [NK, B, H]
            a = a.reshape(N, K * B, -1)
            q = apply_rope(at.q_norm(at.q_proj(a).view(N, K * B, h, D)), *rope_blk)  # [N, KB, h, D]
            kb, vb = at.kv(a, *rope_blk)  # [N, KB, hkv, D]
            kc, vc = at.kv(layer.context(ctx), *rope_ctx)  # [N, S, hkv, D]
            o = block_attention(q.view(N, K, B, h, D), kc, vc.to(kc.dtype), kb.view(N, K, B, hkv, D),
                                vb.view(N, K, B, hkv, D).to(kb.dtype), vis_ctx, vis_own)  # [N, K, B, h, D]
            return at.out(o.reshape(N, K * B, h * D), a).view(N * K, B, -1)

        x = layer.run(x, attention)  # DFlash2's convolutions run along each block
    return drafter.norm(x).view(N, K, B, -1)


@dataclass
class BlockLoss:
    loss: torch.Tensor  # scalar, sum(w * CE) / sum(w)
    slot_correct: torch.Tensor  # [B-1] argmax == label counts over valid slots
    slot_count: torch.Tensor  # [B-1] valid slots
    accept_sum: float  # sum over valid blocks of (leading correct slots + 1)
    blocks: int  # valid blocks

    @property
    def tau_estimate(self) -> float:
        """Teacher-forced acceptance length per block at these anchors (counts the bonus)."""
        return self.accept_sum / max(self.blocks, 1)


def block_loss(
    drafter: DFlashDraft,
    target: Target,
    feats: torch.Tensor,
    ids: torch.Tensor,
    loss_mask: torch.Tensor,
    anchors: torch.Tensor,
    valid: torch.Tensor,
    gamma: float,
    selector_weight: float = 1.0,
) -> BlockLoss:
    """Same-position weighted cross-entropy over the mask slots of every valid block (plus the
    DFlash2 selector's, weighted by selector_weight)."""
    N, S = ids.shape
    B = drafter.cfg.block_size
    out = draft_blocks(drafter, target.embed_tokens, feats, ids, anchors, valid)  # [N, K, B, H]
    logits = drafter.logits(out[:, :, 1:], target.lm_head).float()  # [N, K, B-1, V]
    at = anchors[:, :, None] + torch.arange(1, B, device=ids.device)  # [N, K, B-1] positions a+k
    at = at.clamp_max(S - 1)
    labels = ids.gather(1, at.flatten(1)).view_as(at)
    live = valid[:, :, None] & loss_mask.gather(1, at.flatten(1)).view_as(at).bool()  # [N, K, B-1]
    decay = torch.exp(-torch.arange(B - 1, device=ids.device, dtype=torch.float32) / gamma)  # slot k: exp(-(k-1)/g)
    w = live.float() * decay
    ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view_as(w)
    loss = (w * ce).sum() / w.sum().clamp_min(1e-9)
    # choice [N, K, B-1]: the drafts (DFlash: each slot's argmax; DFlash2: the selector's path)
    if drafter.candidate_selector is not None:
        prev = torch.cat([ids.gather(1, anchors)[:, :, None], labels[:, :, :-1]], dim=-1)  # true predecessors
        sel_loss, choice = selector_loss(drafter.candidate_selector, out[:, :, 1:], logits, prev, labels, w)
        loss = loss + selector_weight * sel_loss
    else:
        choice = logits.argmax(-1)
    with torch.no_grad():
        correct = (choice == labels) & live
        lead = correct.int().cumprod(-1).sum(-1)  # [N, K] leading accepted drafts
        vb = valid & live[:, :, 0]
        return BlockLoss(loss, correct.sum((0, 1)), live.sum((0, 1)), float((lead + 1)[vb].sum()), int(vb.sum()))


def selector_loss(sel, hidden, logits, prev, labels, w) -> tuple[torch.Tensor, torch.Tensor]:
    """DFlash2's selector, teacher-forced: hidden [.., H] slot states, logits [.., V], prev [..]
    true predecessors, labels [..], w [..] slot weights -> (weighted CE of the pairwise scores
    over the top-k candidates, on slots whose label is a candidate; the tokens it picks [..])."""
    unary, cand = logits.topk(sel.top_k, dim=-1)  # [.., k]; the choice of candidates carries no gradient
    scores = unary + sel.pair_scores(sel.hidden_projection(hidden).float(), prev, cand)  # [.., k]
    hit = cand == labels[..., None]  # [.., k]
    wk = w * hit.any(-1)
    ce = F.cross_entropy(scores.flatten(0, -2), hit.float().argmax(-1).flatten(), reduction="none").view_as(wk)
    pick = cand.gather(-1, scores.argmax(-1, keepdim=True))[..., 0]
    return (wk * ce).sum() / wk.sum().clamp_min(1e-9), pick
