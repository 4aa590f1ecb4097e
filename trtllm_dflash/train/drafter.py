"""Train a DFlash drafter for a given target: the published recipe, in plain PyTorch.

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

The training forward calls the DFlashDraft's own submodules (fc, hidden_norm, each
layer's projections and norms, rope, norm): the trained module *is* the inference module,
and `tests/train/test_train_drafter.py` checks that one block of the training forward
equals `DFlashDraft.forward` with its KV cache.

Attention layout: instead of one dense [K*B, S + K*B] mask (K*B*(K*B) wasted scores),
every block attends over its own key list [context (S) ; own block (B)] with the
visibility above: SDPA with batch = N*K. Same maths, (S+B)/(S+K*B) of the work.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from trtllm_dflash.errors import UserError
from trtllm_dflash.reference.cache import KVCache
from trtllm_dflash.reference.config import DraftConfig, TargetConfig, default_target_layer_ids
from trtllm_dflash.reference.draft import DFlashDraft
from trtllm_dflash.reference.target import Target, apply_rope


# ----------------------------------------------------------------------------- the drafter


@dataclass(frozen=True)
class DrafterShape:
    """What the user chooses about a new drafter; the rest is copied from the target."""

    num_layers: int = 1
    block_size: int = 16
    intermediate_size: int | None = None  # default: the target's
    target_layer_ids: tuple[int, ...] | None = None  # default: z-lab's rule for 3 features
    init: str = "target"  # "target": layers/norms copied from the target's last layers; "random"


INITS = ("target", "random")


def default_layer_ids(num_target_layers: int) -> tuple[int, ...]:
    """Three features spread over the target's depth (z-lab's rule for n = 3), or fewer
    for very shallow targets."""
    if num_target_layers >= 5:
        return tuple(default_target_layer_ids(num_target_layers, 3))
    return tuple(range(num_target_layers - 1)) or (0,)


def draft_config(tcfg: TargetConfig, shape: DrafterShape, mask_token_id: int) -> DraftConfig:
    ids = shape.target_layer_ids or default_layer_ids(tcfg.num_layers)
    bad = [i for i in ids if not 0 <= i < tcfg.num_layers]
    if bad:
        raise UserError(f"target_layer_ids {list(ids)}: {bad[0]} is outside the target's layers 0..{tcfg.num_layers - 1}")
    if len(set(ids)) != len(ids):
        raise UserError(f"target_layer_ids {list(ids)} has repeated layers")
    if shape.num_layers < 1:
        raise UserError(f"drafter layers is {shape.num_layers}, expected >= 1")
    if shape.block_size < 2:
        raise UserError(f"block size is {shape.block_size}, expected >= 2 (anchor + at least one mask slot)")
    if not 0 <= mask_token_id < tcfg.vocab_size:
        raise UserError(f"mask_token_id {mask_token_id} is outside the target's vocabulary (0..{tcfg.vocab_size - 1})")
    if shape.init not in INITS:
        raise UserError(f"init {shape.init!r} is not one of {', '.join(INITS)}")
    return DraftConfig(
        hidden_size=tcfg.hidden_size,
        intermediate_size=shape.intermediate_size or tcfg.intermediate_size,
        num_layers=shape.num_layers,
        num_heads=tcfg.num_heads,
        num_kv_heads=tcfg.num_kv_heads,
        head_dim=tcfg.head_dim,
        rms_norm_eps=tcfg.rms_norm_eps,
        rope=tcfg.rope,
        max_position_embeddings=tcfg.max_position_embeddings,
        block_size=shape.block_size,
        target_layer_ids=tuple(sorted(ids)),
        mask_token_id=mask_token_id,
        num_target_layers=tcfg.num_layers,
        vocab_size=tcfg.vocab_size,
    )


def new_drafter(target: Target, shape: DrafterShape, mask_token_id: int, seed: int = 0) -> DFlashDraft:
    """A fresh fp32 drafter for `target`.

    init "random": normal(0, 0.02) matrices, unit norms, final norm = the target's.
    init "target": additionally, drafter layer i starts as a copy of target layer
    L - n + i (the last n layers: they already map a residual stream to the LM head's
    space and carry the target's attention patterns), and `fc` starts as the selector of
    the deepest feature with `hidden_norm` = the input norm of the layer that consumes it,
    so the first drafter layer's context K/V start as (close to) that target layer's own.
    Layers whose shapes differ from the target's (another intermediate size) stay random."""
    cfg = draft_config(target.cfg, shape, mask_token_id)
    torch.manual_seed(seed)
    d = DFlashDraft(cfg).to(target.device)
    tl = target.layers
    with torch.no_grad():
        for name, p in d.named_parameters():
            p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(0.0, 0.02)
        d.norm.weight.copy_(target.norm.weight)
        if shape.init == "target":
            first = len(tl) - cfg.num_layers
            for i, layer in enumerate(d.layers):
                src = tl[first + i].state_dict()
                own = layer.state_dict()
                if all(k in src and src[k].shape == v.shape for k, v in own.items()):
                    layer.load_state_dict(src)
            deepest = max(cfg.target_layer_ids)
            h = cfg.hidden_size
            d.fc.weight.zero_()
            col = cfg.target_layer_ids.index(deepest) * h
            d.fc.weight[:, col : col + h] = torch.eye(h)
            if deepest + 1 < len(tl):
                d.hidden_norm.weight.copy_(tl[deepest + 1].input_layernorm.weight)
    return d.float()


# ----------------------------------------------------------------------------- forward


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


def block_visibility(cfg: DraftConfig, anchors: torch.Tensor, valid: torch.Tensor, S: int) -> list[torch.Tensor]:
    """Per drafter layer: [N*K, 1, B, S+B] bool over keys [context 0..S-1 ; own block].

    Context key s is visible to the block anchored at a iff s < a (and, for sliding layers,
    the query position minus s is within the window); own-block keys are all visible
    (bidirectional) or only up to the query (causal layers). Invalid blocks see only their
    own block (they carry no loss; this keeps softmax finite)."""
    N, K = anchors.shape
    B = cfg.block_size
    dev = anchors.device
    a = anchors.reshape(N * K, 1, 1)  # [NK, 1, 1]
    s = torch.arange(S, device=dev)[None, None, :]  # [1, 1, S]
    j = torch.arange(B, device=dev)
    ctx = (s < a) & valid.reshape(N * K, 1, 1)  # [NK, 1, S]
    out = []
    for causal, kind in zip(cfg.causal, cfg.layer_types):
        c = ctx.expand(-1, B, -1)  # [NK, B, S]
        if kind == "sliding_attention":
            c = c & ((a + j[None, :, None]) - s < cfg.sliding_window)
        blk = (j[None, :] <= j[:, None]) if causal else torch.ones(B, B, dtype=torch.bool, device=dev)
        if kind == "sliding_attention" and not causal:
            blk = blk & ((j[None, :] - j[:, None]).abs() < cfg.sliding_window)
        out.append(torch.cat([c, blk.expand(N * K, -1, -1)], dim=-1)[:, None])  # [NK, 1, B, S+B]
    return out


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
    x = embed(blk_ids).reshape(N, K * B, -1)  # [N, KB, H]
    ctx = drafter.hidden_norm(drafter.fc(feats))  # [N, S, H]
    rope_blk = drafter.rope(blk_pos, x.dtype)
    rope_ctx = drafter.rope(torch.arange(S, device=dev).expand(N, -1), x.dtype)
    vis = block_visibility(cfg, anchors, valid, S)
    for layer, mask in zip(drafter.layers, vis):
        at = layer.self_attn
        a = layer.input_layernorm(x)  # [N, KB, H]
        q = apply_rope(at.q_norm(at.q_proj(a).view(N, K * B, h, D)), *rope_blk)  # [N, KB, h, D]
        kb, vb = at.kv(a, *rope_blk)  # [N, KB, hkv, D]
        kc, vc = at.kv(ctx, *rope_ctx)  # [N, S, hkv, D]
        keys = torch.cat([kc[:, None].expand(N, K, S, hkv, D), kb.view(N, K, B, hkv, D)], dim=2)  # [N, K, S+B, hkv, D]
        vals = torch.cat([vc[:, None].expand(N, K, S, hkv, D), vb.view(N, K, B, hkv, D)], dim=2)
        keys = keys.reshape(N * K, S + B, hkv, D).transpose(1, 2)  # [NK, hkv, S+B, D]
        vals = vals.reshape(N * K, S + B, hkv, D).transpose(1, 2)
        q = q.reshape(N * K, B, h, D).transpose(1, 2)  # [NK, h, B, D]
        o = F.scaled_dot_product_attention(q, keys.to(q.dtype), vals.to(q.dtype), attn_mask=mask, enable_gqa=h != hkv)
        x = x + at.o_proj(o.transpose(1, 2).reshape(N, K * B, h * D))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
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
) -> BlockLoss:
    """Same-position weighted cross-entropy over the mask slots of every valid block."""
    N, S = ids.shape
    B = drafter.cfg.block_size
    out = draft_blocks(drafter, target.embed_tokens, feats, ids, anchors, valid)  # [N, K, B, H]
    logits = target.lm_head(out[:, :, 1:]).float()  # [N, K, B-1, V]
    at = anchors[:, :, None] + torch.arange(1, B, device=ids.device)  # [N, K, B-1] positions a+k
    at = at.clamp_max(S - 1)
    labels = ids.gather(1, at.flatten(1)).view_as(at)
    live = valid[:, :, None] & loss_mask.gather(1, at.flatten(1)).view_as(at).bool()  # [N, K, B-1]
    decay = torch.exp(-torch.arange(B - 1, device=ids.device, dtype=torch.float32) / gamma)  # slot k: exp(-(k-1)/g)
    w = live.float() * decay
    ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view_as(w)
    loss = (w * ce).sum() / w.sum().clamp_min(1e-9)
    with torch.no_grad():
        correct = (logits.argmax(-1) == labels) & live
        lead = correct.int().cumprod(-1).sum(-1)  # [N, K] leading accepted drafts
        vb = valid & live[:, :, 0]
        return BlockLoss(loss, correct.sum((0, 1)), live.sum((0, 1)), float((lead + 1)[vb].sum()), int(vb.sum()))
