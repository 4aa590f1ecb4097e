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

DFlash2 (z-lab's DFlash2DraftModel, `cfg.dflash2`) adds, with the same checkpoint names:
  layers.{i}.attention_conv / mlp_conv   a grouped dynamic depthwise causal convolution
         along the block on each sublayer's input and on its output (DynamicConv);
  candidate_selector                     a low-rank pairwise re-scoring of the top-k
         candidates per slot that picks one path left to right (CandidateSelector).
The convolution's window ends at the block's anchor: tokens before the block contribute
zeros (z-lab pads with zeros every round; vLLM masks the taps that reach before the block
start), so it carries no state from round to round. The only per-row state of either
variant is the context KV cache.
Laguna (poolside's DFlashLagunaForCausalLM, `cfg.laguna`; TensorRT-LLM
tensorrt_llm/_torch/models/modeling_dflash.py, PR #15666) adds, under its checkpoint names:
  aux_hidden_norms.{k}                   an RMSNorm per fused target layer, before fc;
  the layer's input_layernorm            applied to the context too, before its K/V projection;
  layers.{i}.self_attn.g_proj            [heads, H]: each head's attention output times
         softplus(g_proj(x)), x the block's normed attention input (`head_gate`).
The logit scalars of z-lab's later configs apply to both variants: the block embedding is
multiplied by `input_embedding_scale`; `logits()` multiplies by `output_multiplier`, then
soft-caps at `final_logit_softcapping`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from trtllm_dflash.reference.cache import KVCache
from trtllm_dflash.reference.config import DraftConfig
from trtllm_dflash.reference.target import MLP, Attention, RMSNorm, Rope
from trtllm_dflash.reference.verify import SamplingParams, probs, sample


def key_limit(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, kind: str, window: int | None):
    """Which keys a query of a drafter layer sees, among those it may see at all (the
    context before its block's start and its own block). q_pos, k_pos: query and key
    positions, broadcast against each other -> bool of their broadcast shape, True =
    visible; None = all of them (a full, bidirectional layer). A causal layer hides keys
    ahead of the query; a sliding layer hides keys `window` or more positions behind it
    (bidirectional: or ahead of it). The training forward (train/drafter_loss.py) uses it too."""
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
    context's (cached) and the block's own. A Laguna drafter with `gate` scales each head's
    output by softplus(g_proj(x)) before o_proj."""

    def __init__(self, cfg: DraftConfig):
        super().__init__(cfg, qk_norm=True)
        self.g_proj = nn.Linear(cfg.hidden_size, cfg.num_heads, bias=False) if cfg.gate else None

    def forward(self, x, ctx, rope_blk, rope_ctx, cache: KVCache, layer, blk_pos, ctx_pos, kv_len, mask, ctx_rows=None):
        if ctx.shape[1]:
            cache.write(layer, ctx_pos, *self.kv(ctx, *rope_ctx), rows=ctx_rows)
        o = self.heads(self.query(x, *rope_blk), *self.kv(x, *rope_blk), cache, layer, blk_pos, kv_len, mask)
        return self.out(o, x)

    def out(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The heads' output o [.., Hq * D] of attention input x [.., H] through the gate (Laguna)
        and o_proj -> [.., H]. The training forward (train/drafter_loss.py) uses it too."""
        return self.o_proj(o if self.g_proj is None else head_gate(o, self.g_proj(x)))


def head_gate(o: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Laguna's output gate: attention output o [.., Hq * D] times softplus(g) per head, g [.., Hq]
    (softplus in fp32, as TensorRT-LLM's DFlashLagunaForCausalLM._post_attention_gate)."""
    gate = torch.nn.functional.softplus(g.float()).to(o.dtype)  # [.., Hq]
    return (o.unflatten(-1, (g.shape[-1], -1)) * gate[..., None]).flatten(-2)


class DynamicConv(nn.Module):
    """DFlash2's grouped dynamic depthwise causal convolution around one sublayer.

    Side 0 filters the sublayer's input, side 1 its output. The tap weights of side s at
    block slot t are base_kernel[s] (per channel) plus a dynamic term per group of
    conv_group_size channels, which kernel_projection computes from the sublayer's input at t:
        y[t] = sum_o (base_kernel[s, o] + dyn[t, s, o, group]) * x[t - o]
    over o < conv_kernel_size, with x before the block's first slot (the anchor) = 0."""

    def __init__(self, hidden: int, kernel: int, group: int):
        super().__init__()
        self.kernel, self.group = kernel, group
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel, hidden))  # [2, K, H]
        self.kernel_projection = nn.Linear(hidden, 2 * kernel * (hidden // group), bias=False)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sublayer's input x [N, T, H] -> (its filtered input, the side-1 taps [N, T, K, G])."""
        dyn = self.kernel_projection(x).view(*x.shape[:2], 2, self.kernel, -1)  # [N, T, 2, K, G]
        return dynamic_conv(x, dyn[:, :, 0], self.base_kernel[0], self.group), dyn[:, :, 1]

    def finish(self, y: torch.Tensor, dyn: torch.Tensor) -> torch.Tensor:
        """The sublayer's output y [N, T, H] filtered with the taps `prepare` returned."""
        return dynamic_conv(y, dyn, self.base_kernel[1], self.group)


def dynamic_conv(x: torch.Tensor, dyn: torch.Tensor, base: torch.Tensor, group: int) -> torch.Tensor:
    """y[t] = sum_o (base[o] + dyn[t, o, g]) * x[t - o] along the block axis, x = 0 before it.
    x [N, T, H]; dyn [N, T, K, G] (one tap weight per group of `group` channels); base [K, H]."""
    N, T, H = x.shape
    K, G = base.shape[0], H // group
    coef = base.view(K, G, group).to(x.dtype) + dyn[..., None]  # [N, T, K, G, g]
    xs = x.view(N, T, G, group)
    y = coef[:, :, 0] * xs
    for o in range(1, min(K, T)):
        y = y + torch.nn.functional.pad(coef[:, o:, o] * xs[:, :-o], (0, 0, 0, 0, o, 0))
    return y.view(N, T, H)


class DraftLayer(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.context_norm = cfg.laguna
        self.attention_conv = self.mlp_conv = None
        if cfg.dflash2:
            self.attention_conv = DynamicConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)
            self.mlp_conv = DynamicConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)

    def forward(self, x, ctx, *attn_args):
        return self.run(x, lambda h: self.self_attn(h, self.context(ctx), *attn_args))

    def context(self, ctx: torch.Tensor) -> torch.Tensor:
        """The fused context [.., H] this layer projects to K/V: normed like the layer's own input
        (Laguna), or as it is. The training forward uses it too."""
        return self.input_layernorm(ctx) if self.context_norm else ctx

    def run(self, x: torch.Tensor, attention) -> torch.Tensor:
        """x [N, T, H] through the layer; `attention` maps the attention input [N, T, H] to its
        output (inference: over the KV cache; training: over every block's context)."""
        x = x + self._sublayer(self.attention_conv, attention, self.input_layernorm(x))
        return x + self._sublayer(self.mlp_conv, self.mlp, self.post_attention_layernorm(x))

    @staticmethod
    def _sublayer(conv: DynamicConv | None, f, h: torch.Tensor) -> torch.Tensor:
        if conv is None:
            return f(h)
        h, taps = conv.prepare(h)
        return conv.finish(f(h), taps)


@dataclass
class Selection:
    """The selector's path through the candidates of D slots, for B rows."""

    path: torch.Tensor  # [B, D] chosen tokens
    candidates: torch.Tensor  # [B, D, k] candidate token ids (the top-k of the draft logits)
    q: torch.Tensor | None  # [B, D, k] the distributions the path was sampled from (None: greedy)

    def q_vocab(self, vocab: int) -> torch.Tensor:
        """q over the whole vocabulary [B, D, V] (zero outside the candidates)."""
        out = self.q.new_zeros(*self.q.shape[:2], vocab)
        return out.scatter_(-1, self.candidates, self.q)


class CandidateSelector(nn.Module):
    """DFlash2's path selector. Per slot j it takes the top-k tokens of the draft logits with
    their logits as unary scores u, and re-scores candidate c after the predecessor p (the
    anchor for slot 1, else the token chosen at slot j-1) with a low-rank bigram term
    modulated by the slot's hidden state h_j:
        score_j(c) = u_j(c) + sum_r P[p, r] * (W h_j)[r] * S[c, r]
    then picks left to right: argmax, or a sample of softmax(score / temperature) (the
    sampling filters apply to these k scores). The codebooks are stored as bare tensors
    (`candidate_selector.predecessor_codebook`, no `.weight`), as in z-lab's checkpoints."""

    def __init__(self, hidden: int, vocab: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab, rank))  # [V, r]
        self.successor_codebook = nn.Parameter(torch.zeros(vocab, rank))  # [V, r]
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)

    def pair_scores(self, mod: torch.Tensor, prev: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """The bigram term: mod [.., r] = W h, prev [..] predecessors, cand [.., k] -> fp32 [.., k]."""
        return pair_scores(self.predecessor_codebook, self.successor_codebook, mod, prev, cand)

    def select(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor,
               sampling: SamplingParams = SamplingParams(), gen: torch.Generator | None = None,
               path: torch.Tensor | None = None) -> Selection:
        """hidden [B, D, H] final-normed slot states; logits [B, D, V] their draft logits; anchor [B].
        `path` [B, D]: score along these tokens instead of choosing (teacher forcing)."""
        return select_path(self.predecessor_codebook, self.successor_codebook, self.hidden_projection(hidden),
                           logits, anchor, self.top_k, sampling, gen, path)


def pair_scores(pred_codebook, succ_codebook, mod, prev, cand) -> torch.Tensor:
    """sum_r P[prev, r] * mod[r] * S[c, r] for every candidate c: mod [.., r], prev [..],
    cand [.., k] -> fp32 [.., k] (P, S: the [V, r] codebooks)."""
    pred = pred_codebook[prev].float() * mod.float()  # [.., r]
    return (pred[..., None, :] * succ_codebook[cand].float()).sum(-1)


def select_path(pred_codebook, succ_codebook, mod, logits, anchor, top_k: int,
                sampling: SamplingParams = SamplingParams(), gen: torch.Generator | None = None,
                path: torch.Tensor | None = None) -> Selection:
    """The selector's left-to-right choice (CandidateSelector): mod [B, D, r] the projected slot
    states, logits [B, D, V], anchor [B]; `path` [B, D] forces the predecessors."""
    unary, cand = logits.float().topk(top_k, dim=-1)  # [B, D, k]
    prev = anchor
    chosen, qs = [], []
    for j in range(logits.shape[1]):
        s = unary[:, j] + pair_scores(pred_codebook, succ_codebook, mod[:, j], prev, cand[:, j])  # [B, k]
        q = None if sampling.greedy else probs(s, sampling)  # [B, k]
        if path is not None:
            prev = path[:, j]
        else:
            pick = s.argmax(-1) if q is None else sample(q, gen)  # [B]
            prev = cand[:, j].gather(1, pick[:, None])[:, 0]
        chosen.append(prev)
        qs.append(q)
    q = None if sampling.greedy else torch.stack(qs, 1)
    return Selection(torch.stack(chosen, 1), cand, q)


class DFlashDraft(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.fc = nn.Linear(len(cfg.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.aux_hidden_norms = None
        if cfg.laguna:
            self.aux_hidden_norms = nn.ModuleList(RMSNorm(h, cfg.rms_norm_eps) for _ in cfg.target_layer_ids)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.rope = Rope(cfg.rope, cfg.head_dim)
        self.candidate_selector = None
        if cfg.dflash2:
            self.candidate_selector = CandidateSelector(h, cfg.vocab_size, cfg.selector_rank, cfg.selector_top_k)

    def fuse(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """The fc input [.., n*H]: the target features, each layer's RMS-normed first (Laguna)."""
        if self.aux_hidden_norms is None:
            return target_hidden
        chunks = target_hidden.chunk(len(self.aux_hidden_norms), dim=-1)  # n x [.., H]
        return torch.cat([norm(c) for norm, c in zip(self.aux_hidden_norms, chunks)], dim=-1)

    def logits(self, hidden: torch.Tensor, lm_head) -> torch.Tensor:
        """Draft logits of final-normed slot states [.., H] through the target's LM head [.., V]."""
        out = lm_head(hidden)
        if self.cfg.output_multiplier != 1.0:
            out = out * self.cfg.output_multiplier
        cap = self.cfg.final_logit_softcapping
        return out if cap is None else torch.tanh(out / cap) * cap

    def embed_scale(self, noise: torch.Tensor) -> torch.Tensor:
        """The block's target embedding [.., H] times input_embedding_scale."""
        s = self.cfg.input_embedding_scale
        return noise if s == 1.0 else noise * s

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
        ctx_rows = None  # which row each context entry belongs to, once packed
        valid = ctx_pos != cache.trash  # [B, Tc]
        if not bool(valid.all()):
            # Ragged context: only the real rows are projected, packed [1, N]. The rows are padded
            # to the longest row's, and a request that has just joined brings its whole prompt:
            # projected with their padding, the round after a join at 16 requests drafted in 2.3x
            # the steady pass's time (perf/bench_drafter_context.py).
            b, t = valid.nonzero(as_tuple=True)  # [N]
            target_hidden, ctx_pos, ctx_rows = target_hidden[b, t][None], ctx_pos[b, t][None], b[None]
        ctx = self.hidden_norm(self.fc(self.fuse(target_hidden)))  # [B, Tc, H], or packed [1, N, H]
        rope_blk = self.rope(blk_pos, noise.dtype)
        rope_ctx = self.rope(ctx_pos, noise.dtype)  # no padding left
        x = self.embed_scale(noise)
        for i, layer in enumerate(self.layers):
            x = layer(x, ctx, rope_blk, rope_ctx, cache, i, blk_pos, ctx_pos, kv_len, masks[i], ctx_rows)
        return self.norm(x)
