"""The DFlash drafter: Qwen3 decoder layers conditioned on target features by KV injection.

Parameter names are exactly the z-lab checkpoint names (`fc.weight`, `hidden_norm.weight`,
`norm.weight`, `layers.{i}....`), so `state_dict()` is the checkpoint. There is no
embedding and no LM head: the caller embeds the block with the target's `embed_tokens`
and projects the output with the target's `lm_head`.

One draft pass, per sequence, with `start` = position of the anchor:
  c      = hidden_norm(fc(target_hidden))            new context, positions [start-n, start)
  every layer l: K/V of c (k_norm + RoPE at the context positions) are appended to the
         layer's context cache; the block [anchor, mask x (T-1)] at positions
         [start, start+T) attends over [all cached context ; block].
  out    = norm(x)                                   slot j proposes the token at start+j
Block K/V are written into the cache slots [start, start+T) as scratch: those slots are
overwritten by real context K/V next round, so the cache keeps context only.
Full-attention layers see the whole block (bidirectional); causal / sliding layers see the
block causally and only keys within `sliding_window` positions.
"""

from __future__ import annotations

import torch
from torch import nn

from trtllm_dflash.reference.cache import KVCache
from trtllm_dflash.reference.config import DraftConfig
from trtllm_dflash.reference.target import MLP, Attention, RMSNorm, Rope


def key_limit(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, kind: str, window: int | None):
    """Which keys a query of a drafter layer sees, among those it may see at all (the
    context before its block's start and its own block). q_pos, k_pos: query and key
    positions, broadcast against each other -> bool of their broadcast shape, True =
    visible; None = all of them (a full, bidirectional layer). A causal layer hides keys
    ahead of the query; a sliding layer hides keys `window` or more positions behind it
    (bidirectional: or ahead of it). The training forward (train/drafter.py) uses it too."""
    if not causal and kind == "full_attention":
        return None
    dist = q_pos - k_pos  # query pos - key pos
    vis = dist >= 0 if causal else torch.ones_like(dist, dtype=torch.bool)
    if kind == "sliding_attention":
        vis = vis & (dist < window)
        if not causal:
            vis = vis & (-dist < window)
    return vis


class DraftAttention(Attention):
    """The target's attention layout with q/k norms; keys and values are the injected
    context's (cached) and the block's own."""

    def __init__(self, cfg: DraftConfig):
        super().__init__(cfg, qk_norm=True)

    def forward(self, x, ctx, rope_blk, rope_ctx, cache: KVCache, layer, blk_pos, ctx_pos, kv_len, mask):
        if ctx.shape[1]:
            cache.write(layer, ctx_pos, *self.kv(ctx, *rope_ctx))
        return self.attend(self.query(x, *rope_blk), *self.kv(x, *rope_blk), cache, layer, blk_pos, kv_len, mask)


class DraftLayer(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, ctx, *attn_args):
        x = x + self.self_attn(self.input_layernorm(x), ctx, *attn_args)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraft(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.fc = nn.Linear(len(cfg.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.rope = Rope(cfg.rope, cfg.head_dim)

    @property
    def block_size(self) -> int:
        return self.cfg.block_size

    @property
    def mask_token_id(self) -> int:
        return self.cfg.mask_token_id

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return self.cfg.target_layer_ids

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        c, w = self.cfg, self.fc.weight
        return KVCache(c.num_layers, batch, c.num_kv_heads, max_len, c.head_dim, w.dtype, w.device)

    def masks(self, start: torch.Tensor, T: int, kv_len: int) -> list[torch.Tensor | None]:
        """Per-layer visibility [B, 1, T, kv_len] for a block at positions start + [0, T)."""
        q = start[:, None] + torch.arange(T, device=start.device)  # [B, T] query positions
        s = torch.arange(kv_len, device=start.device)  # [S] key slots = positions
        own = s[None, None, :] < (start + T)[:, None, None]  # [B, 1, S]: context + own block
        full = None if bool(own.all()) else own[:, None].expand(-1, 1, T, -1)
        out = []
        for causal, kind in zip(self.cfg.causal, self.cfg.layer_types):
            limit = key_limit(q[:, :, None], s, causal, kind, self.cfg.sliding_window)  # [B, T, S] or None
            out.append(full if limit is None else (own & limit)[:, None])
        return out

    def forward(
        self,
        noise: torch.Tensor,  # [B, T, H] target embedding of [anchor, mask, ..., mask]
        start: torch.Tensor,  # [B] position of the anchor (= number of committed context positions)
        target_hidden: torch.Tensor,  # [B, Tc, n*H] new context features (concatenated target layers)
        ctx_pos: torch.Tensor,  # [B, Tc] their positions; padding entries point at cache.trash
        cache: KVCache,
    ) -> torch.Tensor:  # [B, T, H] final-normed
        T = noise.shape[1]
        blk_pos = start[:, None] + torch.arange(T, device=start.device)  # [B, T]
        kv_len = int(start.max()) + T
        masks = self.masks(start, T, kv_len)
        ctx = self.hidden_norm(self.fc(target_hidden))  # [B, Tc, H]
        rope_blk = self.rope(blk_pos, noise.dtype)
        rope_ctx = self.rope(ctx_pos.clamp_max(cache.trash - 1), noise.dtype)
        x = noise
        for i, layer in enumerate(self.layers):
            x = layer(x, ctx, rope_blk, rope_ctx, cache, i, blk_pos, ctx_pos, kv_len, masks[i])
        return self.norm(x)
