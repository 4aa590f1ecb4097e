"""The target: a flat Qwen3 / Llama / Qwen3-MoE decoder over a static KV cache.

Module and parameter names are the HF checkpoint names without the leading `model.`, so
an HF directory loads with a plain `load_state_dict` (see loading.py). One forward serves
prefill, the 1-token AR step, block verification and tree verification: the caller
passes explicit positions, the cache slots to write (= positions, except for tree nodes,
which share positions and are compacted after acceptance), how many cache slots to attend
(`kv_len`) and a boolean visibility mask.

`capture` returns the outputs of chosen decoder layers, concatenated on the feature axis:
the un-normed residual stream after layer i, which is HF `hidden_states[i + 1]` (for the
last layer HF reports the final-normed output, and so do we).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from trtllm_dflash.reference.cache import KVCache
from trtllm_dflash.reference.config import DraftConfig, TargetConfig
from trtllm_dflash.reference.rope import RopeConfig


class RMSNorm(nn.Module):
    """Qwen3 / Llama RMSNorm: normalise in fp32, cast back, then scale."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # F.rms_norm computes x * rsqrt(mean(x^2) + eps) in one kernel (bit-identical to the
        # spelled-out form); the weight is applied after the cast back, as HF does.
        return self.weight * F.rms_norm(x.float(), self.weight.shape, eps=self.eps).to(x.dtype)


def building_on_meta() -> bool:
    """Inside `with torch.device("meta")`, where the loaders build a model's skeleton and then load
    every tensor (and rebuild the RoPE tables): computing anything there (an init, a table) runs
    torch._refs, whose first use imports torch._dynamo, about 2 s of every server's start-up."""
    return torch.get_default_device().type == "meta"


class Rope(nn.Module):
    """Precomputed NeoX (rotate-half) tables, grown on demand. `sin` is stored with the
    rotate-half sign folded in (first half negated), see apply_rope."""

    def __init__(self, rope: RopeConfig, head_dim: int, max_len: int = 4096):
        super().__init__()
        if building_on_meta():  # shapes only
            for name, shape in (("inv_freq", [head_dim // 2]), ("cos", [max_len, head_dim]),
                                ("sin", [max_len, head_dim])):
                self.register_buffer(name, torch.empty(shape), persistent=False)
            return
        self.register_buffer("inv_freq", rope.inv_freq(head_dim), persistent=False)  # [D/2]
        self._build(max_len)

    def _build(self, n: int) -> None:
        freqs = torch.outer(torch.arange(n, device=self.inv_freq.device).float(), self.inv_freq)  # [n, D/2]
        self.register_buffer("cos", torch.cat([freqs, freqs], dim=-1).cos(), persistent=False)  # [n, D]
        self.register_buffer("sin", torch.cat([-freqs.sin(), freqs.sin()], dim=-1), persistent=False)  # [n, D]

    def forward(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """pos [B, T] -> cos, sin [B, T, 1, D] (broadcast over heads)."""
        need = int(pos.max()) + 1
        if need > self.cos.shape[0]:
            self._build(max(need, 2 * self.cos.shape[0]))
        return self.cos[pos, None].to(dtype), self.sin[pos, None].to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D]; cos, sin [B, T, 1, D] from Rope. Rotate-half is x*cos + [-x2, x1]*sin;
    with the sign folded into the table's first half that is x*cos + [x2, x1]*sin, and
    [x2, x1] is x rolled by D/2 (exact: negation commutes with rounding)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=bias)
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoe(nn.Module):
    """Qwen3-MoE block: softmax router over all experts, top-k, optional renormalisation."""

    def __init__(self, cfg: TargetConfig):
        super().__init__()
        moe = cfg.moe
        self.top_k, self.norm_topk_prob = moe.top_k, moe.norm_topk_prob
        self.gate = nn.Linear(cfg.hidden_size, moe.num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(cfg.hidden_size, moe.intermediate_size) for _ in range(moe.num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # [N, H]
        probs = F.softmax(self.gate(flat), dim=-1, dtype=torch.float)  # [N, E]
        weight, expert = probs.topk(self.top_k, dim=-1)  # [N, k]
        if self.norm_topk_prob:
            weight = weight / weight.sum(-1, keepdim=True)
        weight = weight.to(x.dtype)
        out = torch.zeros_like(flat)
        for e in expert.unique().tolist():
            token, slot = (expert == e).nonzero(as_tuple=True)
            out.index_add_(0, token, self.experts[e](flat[token]) * weight[token, slot, None])
        return out.view_as(x)


class Attention(nn.Module):
    """Q/K/V/O projections with optional per-head q/k RMSNorm (the drafter's DraftAttention
    builds on it: the same parameter names in both checkpoints)."""

    def __init__(self, cfg: TargetConfig | DraftConfig, qk_norm: bool):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        self.q_proj = nn.Linear(h, self.n_heads * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, self.n_kv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, self.n_kv * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=cfg.attention_bias)
        if qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = nn.Identity()

    def query(self, x, cos, sin):
        """x [B, T, H] -> q [B, T, Hq, D] (normed and rotated)."""
        B, T, _ = x.shape
        return apply_rope(self.q_norm(self.q_proj(x).view(B, T, self.n_heads, self.head_dim)), cos, sin)

    def kv(self, x, cos, sin):
        """x [B, T, H] -> k, v [B, T, Hkv, D] (k normed and rotated)."""
        B, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, T, self.n_kv, self.head_dim))
        return apply_rope(k, cos, sin), self.v_proj(x).view(B, T, self.n_kv, self.head_dim)

    def heads(self, q, k, v, cache: KVCache, layer: int, slots, kv_len: int, mask):
        """Write k, v [B, T, Hkv, D] into cache `slots` [B, T], then q [B, T, Hq, D] attends
        over cache slots [0, kv_len) under `mask` -> [B, T, Hq * D] (before o_proj)."""
        B, T = q.shape[:2]
        cache.write(layer, slots, k, v)
        keys, values = cache.view(layer, kv_len)  # [B, Hkv, S, D]
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=self.n_heads != self.n_kv
        )  # [B, Hq, T, D]
        return o.transpose(1, 2).reshape(B, T, -1)

    def attend(self, q, k, v, cache: KVCache, layer: int, slots, kv_len: int, mask):
        """`heads`, then o_proj -> [B, T, H]."""
        return self.o_proj(self.heads(q, k, v, cache, layer, slots, kv_len, mask))

    def forward(self, x, cos, sin, cache: KVCache, layer: int, slots, kv_len: int, mask, valid=None):
        """x [B, T, H]; or, with valid [B, T] (bool), x [N, H] holds only the N valid tokens of
        [B, T] (a packed batch: rows of different lengths): the projections run on those N
        tokens, attention on the padded [B, T] (padding rows are written to the cache past
        every valid position, where nothing reads them)."""
        if valid is None:
            q = self.query(x, cos, sin)  # [B, T, H, D]
            k, v = self.kv(x, cos, sin)  # [B, T, Hkv, D]
            return self.attend(q, k, v, cache, layer, slots, kv_len, mask)
        B, T = valid.shape
        pad = lambda t, n: t.new_zeros(B, T, n, self.head_dim).masked_scatter(valid[..., None, None], t)  # noqa: E731
        q = apply_rope(self.q_norm(pad(self.q_proj(x), self.n_heads)), cos, sin)  # [B, T, Hq, D]
        k = apply_rope(self.k_norm(pad(self.k_proj(x), self.n_kv)), cos, sin)  # [B, T, Hkv, D]
        v = pad(self.v_proj(x), self.n_kv)  # [B, T, Hkv, D]
        return self.o_proj(self.heads(q, k, v, cache, layer, slots, kv_len, mask)[valid])  # [N, H]


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TargetConfig, index: int):
        super().__init__()
        self.self_attn = Attention(cfg, cfg.qk_norm)
        sparse = cfg.moe is not None and cfg.moe.sparse_layers[index]
        self.mlp = SparseMoe(cfg) if sparse else MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, cache, layer, slots, kv_len, mask, valid=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer, slots, kv_len, mask, valid)
        return x + self.mlp(self.post_attention_layernorm(x))


class Target(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.cfg = cfg
        skeleton = torch.empty(cfg.vocab_size, cfg.hidden_size) if building_on_meta() else None  # no normal_ init
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=skeleton)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope = Rope(cfg.rope, cfg.head_dim)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        c = self.cfg
        return KVCache(c.num_layers, batch, c.num_kv_heads, max_len, c.head_dim, self.dtype, self.device)

    def forward(
        self,
        ids: torch.Tensor,  # [B, T]
        pos: torch.Tensor,  # [B, T] absolute (RoPE) positions
        cache: KVCache,
        kv_len: int,  # attend over cache slots [0, kv_len)
        mask: torch.Tensor | None,  # [B, 1, T, kv_len] bool, True = visible; None = all visible
        capture: Sequence[int] = (),
        logits_at: torch.Tensor | None = None,  # [B, K] indices into T; None = all T
        slots: torch.Tensor | None = None,  # [B, T] cache slots to write; default = pos
        valid: torch.Tensor | None = None,  # [B, T] bool: only these tokens run (see Attention.forward)
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # logits [B, K, V], features [B, T, n*H]
        x = self.embed_tokens(ids if valid is None else ids[valid])  # [B, T, H], or [N, H] packed
        cos, sin = self.rope(pos, x.dtype)
        feats = {}
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i, pos if slots is None else slots, kv_len, mask, valid)
            if i in capture and i != last:
                feats[i] = x
        x = self.norm(x)
        if last in capture:
            feats[last] = x  # HF reports the final-normed output as hidden_states[L]
        features = torch.cat([feats[i] for i in capture], dim=-1) if capture else None  # [B, T, n*H] or [N, n*H]
        if valid is not None:  # packed: only the valid tokens' logits and features, scattered back to [B, T]
            unpack = lambda t: t.new_zeros(*valid.shape, t.shape[-1]).masked_scatter(valid[..., None], t)  # noqa: E731
            assert logits_at is None, "a packed batch returns every valid token's logits"
            return unpack(self.lm_head(x)), None if features is None else unpack(features)
        if logits_at is not None:
            x = x.gather(1, logits_at[..., None].expand(-1, -1, x.shape[-1]))  # [B, K, H]
        return self.lm_head(x), features
