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

import copy
import time
from dataclasses import dataclass, field, fields

import torch
import torch.nn.functional as F

from trtllm_dflash.errors import UserError
from trtllm_dflash.reference.cache import KVCache
from trtllm_dflash.reference.config import (
    DFLASH2_KEYS,
    DecoderConfig,
    DraftConfig,
    TargetConfig,
    default_target_layer_ids,
)
from trtllm_dflash.reference.draft import DFlashDraft, key_limit
from trtllm_dflash.reference.target import Target, apply_rope
from trtllm_dflash.train.common import adamw_decay_groups, atomic_dir, check_resume, load_checkpoint, optimizer_step
from trtllm_dflash.train.common import progress_bar, restore, save_checkpoint, set_lr
from trtllm_dflash.train.drafter_config import (
    INITS,
    RESUME_FREE,
    SCHEDULES,
    VARIANTS,
    DrafterShape,
    DrafterTrainConfig,
    default_gamma,
    lr_at,
)


# ----------------------------------------------------------------------------- the drafter


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
    if shape.variant not in VARIANTS:
        raise UserError(f"variant {shape.variant!r} is not one of {', '.join(VARIANTS)}")
    extra = {}
    if shape.variant == "dflash2":
        for name in DFLASH2_KEYS:
            if getattr(shape, name) < 1:
                raise UserError(f"{name} is {getattr(shape, name)}, expected >= 1")
            extra[name] = getattr(shape, name)
        if tcfg.hidden_size % shape.conv_group_size:
            raise UserError(f"conv_group_size {shape.conv_group_size} does not divide the hidden size {tcfg.hidden_size}")
        if shape.selector_top_k > tcfg.vocab_size:
            raise UserError(f"selector_top_k {shape.selector_top_k} exceeds the vocabulary ({tcfg.vocab_size})")
    decoder = {f.name: getattr(tcfg, f.name) for f in fields(DecoderConfig)}  # the target's widths, heads, norms, RoPE
    decoder.update(intermediate_size=shape.intermediate_size or tcfg.intermediate_size, num_layers=shape.num_layers)
    return DraftConfig(
        **decoder,
        block_size=shape.block_size,
        target_layer_ids=tuple(sorted(ids)),
        mask_token_id=mask_token_id,
        num_target_layers=tcfg.num_layers,
        vocab_size=tcfg.vocab_size,
        **extra,
    )


def new_drafter(target: Target, shape: DrafterShape, mask_token_id: int, seed: int = 0) -> DFlashDraft:
    """A fresh fp32 drafter for `target`.

    init "random": normal(0, 0.02) matrices, unit norms, final norm = the target's; DFlash2's
    convolutions start as the identity (so the selector starts as near-argmax).
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
            if name.endswith("base_kernel"):  # DFlash2: start as the identity (tap 0 = 1, others 0)
                p.zero_()
                p[:, 0] = 1.0
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


# ----------------------------------------------------------------------------- training loop


@dataclass
class EvalResult:
    tau: float  # in-loop: committed tokens per target verify pass, decoding held-out prompts
    tau_teacher_forced: float  # the same drafter scored at every position of the target's greedy text
    identical: int  # prompts whose dflash output equals the target's greedy continuation
    prompts: int
    seconds: float


@torch.no_grad()
def evaluate(drafter: DFlashDraft, target: Target, prompt_ids: torch.Tensor, greedy_ids: torch.Tensor,
             new_tokens: int, gamma: float) -> EvalResult:
    """Decode the prompts with the reference loop (greedy, batch) and measure tau; also the
    teacher-forced estimate (64 random anchors per prompt in the target's own greedy text)
    for comparison: it overstates tau, because the decode loop spends most of its rounds
    in the hard stretches."""
    from trtllm_dflash.reference.generate import generate
    from trtllm_dflash.reference.records import pooled_tau

    t0 = time.perf_counter()
    was = drafter.training
    drafter.eval()
    if len(greedy_ids) != len(prompt_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(greedy_ids)} greedy continuations")
    n = min(new_tokens, greedy_ids.shape[1])
    gens = generate(target, drafter, prompt_ids.tolist(), n, mode="dflash", stop_token_ids=[])
    identical = sum(g.tokens == greedy_ids[i, :n].tolist() for i, g in enumerate(gens))
    ids = torch.cat([prompt_ids, greedy_ids[:, :n]], dim=1).to(target.device)
    lm = torch.zeros_like(ids)
    lm[:, prompt_ids.shape[1] :] = 1
    feats = target_features(target, ids, drafter.target_layer_ids)
    anchors, valid = sample_anchors(lm, 64, drafter.block_size, torch.Generator().manual_seed(0))
    tf = block_loss(drafter, target, feats, ids, lm, anchors, valid, gamma).tau_estimate
    drafter.train(was)
    # first round commits 1 (the prefill token) and is not a verify pass: stats exclude it
    return EvalResult(pooled_tau(gens), tf, identical, len(gens), time.perf_counter() - t0)


@dataclass
class TrainResult:
    drafter: DFlashDraft
    step: int
    done: bool  # reached cfg.steps (False: stopped by the time budget, resumable)
    history: list = field(default_factory=list)  # logged steps and evaluations, all sessions
    elapsed: float = 0.0  # training seconds, all sessions


def _check_resume(saved: dict, dcfg: DraftConfig, cfg: DrafterTrainConfig, path) -> None:
    from dataclasses import asdict

    check_resume(saved["draft_config"], dcfg.to_dict(), path, "drafter config field", rerun_with="the same shape")
    # settings added since a checkpoint was written take their defaults (the behaviour it was trained with)
    train_config = {**asdict(DrafterTrainConfig()), **saved["train_config"]}
    check_resume(train_config, asdict(cfg), path, "training setting", free=RESUME_FREE)


def train(
    target: Target,
    input_ids: torch.Tensor,  # [N, S] prompt + target greedy continuation
    loss_mask: torch.Tensor,  # [N, S] 1 on generated tokens
    eval_prompts: torch.Tensor,  # [M, P] held-out prompts
    eval_greedy: torch.Tensor,  # [M, G] the target's greedy continuations of them
    shape: DrafterShape,
    mask_token_id: int,
    cfg: DrafterTrainConfig,
    ckpt_dir,
    resume: bool = False,
    max_seconds: float | None = None,
    progress: bool = True,
    log=print,
) -> TrainResult:
    """Train (or resume) a drafter for `target` (frozen) and return it in fp32.

    Every `ckpt_every` steps, and when `max_seconds` of this session have passed, a
    checkpoint (drafter, optimizer, step, RNG states, data cursor, history) is written to
    ckpt_dir/last.pt; `resume=True` continues from it and draws the same batches and
    anchors as an uninterrupted run would."""
    from dataclasses import asdict
    from pathlib import Path

    dev = target.device
    freeze(target)
    N, S = input_ids.shape
    B = shape.block_size
    if S < B + 1:
        raise UserError(f"training sequences have {S} tokens, fewer than block size + 1 = {B + 1}")
    if cfg.seqs_per_step < 1 or cfg.anchors < 1 or cfg.steps < 1:
        raise UserError("steps, seqs_per_step and anchors must be >= 1")
    if cfg.schedule not in SCHEDULES:
        raise UserError(f"schedule {cfg.schedule!r} is not one of {', '.join(SCHEDULES)}")
    if int(input_ids.max()) >= target.cfg.vocab_size:
        raise UserError(f"training data has token id {int(input_ids.max())}, outside the target's vocabulary "
                        f"(vocab_size {target.cfg.vocab_size}); was it generated with another tokenizer?")
    gamma = cfg.gamma or default_gamma(B)
    drafter = new_drafter(target, shape, mask_token_id, cfg.seed).to(dev).train()
    dcfg = drafter.cfg
    opt = adamw_decay_groups(drafter, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2))
    anchor_gen = torch.Generator().manual_seed(cfg.seed + 1)
    step, cursor, history, elapsed_before = 0, 0, [], 0.0
    ckpt_dir = Path(ckpt_dir)
    ckpt = ckpt_dir / "last.pt"
    resumable = {"drafter": drafter, "optimizer": opt, "anchor_rng": anchor_gen}  # saved and restored by name
    if resume:
        state = load_checkpoint(ckpt)
        _check_resume(state, dcfg, cfg, ckpt)
        restore(state, resumable)
        step, cursor, history, elapsed_before = state["step"], state["cursor"], state["history"], state["elapsed"]
        log(f"resumed from {ckpt} at step {step} ({elapsed_before:.0f}s trained so far)")

    t_start = time.perf_counter()

    def elapsed() -> float:
        return elapsed_before + time.perf_counter() - t_start

    def save() -> None:
        save_checkpoint(ckpt, resumable, step=step, cursor=cursor, history=history, elapsed=elapsed(),
                        draft_config=dcfg.to_dict(), train_config=asdict(cfg), shape=asdict(shape))

    # evaluation prompts: evenly spaced over the held-out set (it is ordered by file)
    eval_rows = torch.linspace(0, len(eval_prompts) - 1, min(cfg.eval_prompts, len(eval_prompts))).round().long()

    def order(epoch: int) -> torch.Tensor:
        return torch.randperm(N, generator=torch.Generator().manual_seed(cfg.seed * 100_003 + epoch))

    def run_eval() -> EvalResult:
        r = evaluate(drafter, target, eval_prompts[eval_rows], eval_greedy[eval_rows], cfg.eval_new_tokens, gamma)
        history.append({"step": step, "elapsed": round(elapsed(), 1), "eval_tau": round(r.tau, 3),
                        "eval_tau_teacher_forced": round(r.tau_teacher_forced, 3),
                        "eval_identical": f"{r.identical}/{r.prompts}"})
        log(f"eval step {step}: in-loop tau {r.tau:.2f} (teacher-forced estimate {r.tau_teacher_forced:.2f}), "
            f"greedy-identical {r.identical}/{r.prompts}, {r.seconds:.1f}s")
        return r

    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cfg.bf16)
    # Features come from a bf16 copy of the target (its KV cache is in the weights' dtype);
    # the fp32 target serves the embedding, the LM head and the in-loop evaluation.
    feature_target = freeze(copy.deepcopy(target).to(torch.bfloat16)) if cfg.bf16 else target
    bar = progress_bar("drafter", "loss {task.fields[loss]:.3f} acc1 {task.fields[acc1]:.2f} tau~ {task.fields[tf]:.2f} "
                       "tau {task.fields[tau]:.2f} {task.fields[sps]:.2f}s/step", progress)
    last_tau = history[-1]["eval_tau"] if history and "eval_tau" in history[-1] else float("nan")
    ema = None
    with bar:
        task = bar.add_task("train", total=cfg.steps, completed=step, loss=float("nan"), acc1=0.0, tf=0.0, tau=last_tau, sps=0.0)
        while step < cfg.steps:
            if max_seconds is not None and time.perf_counter() - t_start > max_seconds:
                save()
                log(f"time budget reached at step {step}/{cfg.steps}; checkpoint {ckpt} (resume with --resume)")
                return TrainResult(drafter, step, False, history, elapsed())
            t0 = time.perf_counter()
            epoch, i = divmod(cursor, N)
            rows = order(epoch)[i : i + cfg.seqs_per_step]
            cursor += len(rows)
            ids, lm = input_ids[rows].to(dev), loss_mask[rows].to(dev)
            anchors, valid = sample_anchors(lm, cfg.anchors, B, anchor_gen)
            lr = lr_at(cfg, step)
            set_lr(opt, lr)
            feats = target_features(feature_target, ids, dcfg.target_layer_ids)
            with autocast:
                res = block_loss(drafter, target, feats, ids, lm, anchors, valid, gamma, cfg.selector_weight)
            optimizer_step(drafter, opt, res.loss, cfg.grad_clip)
            step += 1
            loss = res.loss.item()
            ema = loss if ema is None else 0.95 * ema + 0.05 * loss
            acc = (res.slot_correct / res.slot_count.clamp_min(1)).tolist()
            sps = time.perf_counter() - t0
            if step % cfg.log_every == 0:
                history.append({"step": step, "elapsed": round(elapsed(), 1), "loss": round(loss, 4),
                                "loss_ema": round(ema, 4), "lr": lr, "acc": [round(a, 3) for a in acc],
                                "tau_estimate": round(res.tau_estimate, 3)})
                log(f"step {step}/{cfg.steps} loss {loss:.3f} (ema {ema:.3f}) lr {lr:.2e} slot-1 acc {acc[0]:.2f} "
                    f"tau~ {res.tau_estimate:.2f} {sps:.2f}s/step {elapsed():.0f}s")
            if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
                last_tau = run_eval().tau
            bar.update(task, completed=step, loss=ema, acc1=acc[0], tf=res.tau_estimate, tau=last_tau, sps=sps)
            if step % cfg.ckpt_every == 0:
                save()
        run_eval()
        save()
    return TrainResult(drafter, step, True, history, elapsed())


def export(drafter: DFlashDraft, out_dir, dtype: torch.dtype = torch.bfloat16, summary: dict | None = None):
    """Write the z-lab layout (config.json + model.safetensors) atomically, plus training.json."""
    import json
    from pathlib import Path

    from trtllm_dflash.reference.loading import save_drafter

    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        save_drafter(drafter, tmp, dtype)
        if summary is not None:
            (tmp / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    return out_dir
