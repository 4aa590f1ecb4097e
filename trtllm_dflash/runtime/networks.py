"""The engine backend's two DFlash networks, written once over a small op set.

  target_tap      the target engine's extra output: the fused context row of every token,
                  hidden_norm(fc(concat(outputs of target_layer_ids)))  [N, H]
                  (design C: the target engine computes it in-graph, so only H floats per
                  token leave the engine instead of n*H)
  drafter_forward the drafter engine: one pass over the block [anchor, mask x (T-1)] whose
                  attention is the KV-injection plugin over the per-layer context cache
                  (the arena), after the new context rows' K/V are appended to it
                  (= drafter_logits(drafter_hidden(...)))
  drafter_path    DFlash2 only: the candidate selector's greedy path through the top-k
                  candidates of every slot (the drafts a DFlash2 drafter proposes)

DFlash2 drafters (DrafterSpec.conv_kernel set) also wrap every attention and MLP sublayer
in the grouped dynamic causal convolution along the block (ops.conv_prepare / conv_finish,
no state across rounds); the logit / embedding scalars apply to both variants.

Weights are named as the convert stage writes the drafter checkpoint (formats/weight_maps.py
DRAFTER_MAP: `transformer.layers.{i}.attention.q`, fused `attention.kv`, `mlp.fc` = gate,
`mlp.gate` = up, ...). Two implementations of `Ops`:
  TorchOps   (runtime/ops_torch.py)    torch tensors; runs on CPU; proven token-exact against
                                     the reference drafter on the shipped pair
  TrtllmOps  (engines/ops_trtllm.py)   TensorRT-LLM 1.2.1's functional API plus our AOT
                                     TensorRT plugin; GPU-only, used by trtllm_models.py
Tensors are [B, T, ...] (batch of sequences, tokens of each), shapes in the comments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

Tensor = Any  # a torch.Tensor (TorchOps) or a tensorrt_llm.functional.Tensor (TrtllmOps)


@dataclass(frozen=True)
class DrafterSpec:
    """What the drafter network needs besides its weights (from the checkpoint's config.json)."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    causal: tuple[bool, ...]  # per layer: causal inside the block
    window: tuple[int | None, ...]  # per layer: sliding window, None = full attention
    bias: bool  # attention projections carry biases
    embedding_scale: float = 1.0  # input_embedding_scale
    output_multiplier: float = 1.0
    softcap: float | None = None  # final_logit_softcapping
    conv_kernel: int | None = None  # DFlash2: taps of the sublayer convolutions (None: DFlash)
    conv_group: int | None = None  # DFlash2: channels per dynamic tap
    selector_top_k: int | None = None  # DFlash2: candidates per slot

    @classmethod
    def from_config(cls, cfg) -> "DrafterSpec":
        """From a reference DraftConfig."""
        window = tuple(cfg.sliding_window if kind == "sliding_attention" else None for kind in cfg.layer_types)
        return cls(cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps, tuple(cfg.causal),
                   window, cfg.attention_bias, cfg.input_embedding_scale, cfg.output_multiplier,
                   cfg.final_logit_softcapping, cfg.conv_kernel_size, cfg.conv_group_size, cfg.selector_top_k)


class Ops(Protocol):
    """The op set both networks are written in. Weight names are the checkpoint's without `.weight`."""

    def embed(self, ids: Tensor, name: str) -> Tensor: ...  # ids [B, T] -> [B, T, H]
    def linear(self, x: Tensor, name: str) -> Tensor: ...  # x @ W.T (+ b)
    def rms_norm(self, x: Tensor, name: str, eps: float) -> Tensor: ...  # over the last dim
    def heads(self, x: Tensor, n: int, d: int) -> Tensor: ...  # [B, T, n*d] -> [B, T, n, d]
    def merge_heads(self, x: Tensor) -> Tensor: ...  # [B, T, n, d] -> [B, T, n*d]
    def split(self, x: Tensor, sizes: Sequence[int]) -> list[Tensor]: ...  # on the last dim
    def concat(self, xs: Sequence[Tensor]) -> Tensor: ...  # on the last dim
    def rope(self, x: Tensor, pos: Tensor) -> Tensor: ...  # NeoX rotary, x [B, T, n, D], pos [B, T]
    def silu_mul(self, a: Tensor, b: Tensor) -> Tensor: ...  # silu(a) * b
    def add(self, a: Tensor, b: Tensor) -> Tensor: ...
    def drop_first_token(self, x: Tensor) -> Tensor: ...  # [B, T, ...] -> [B, T-1, ...]
    def inject(self, layer: int, k: Tensor, v: Tensor) -> None: ...  # append context K/V to the arena
    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, causal: bool, window: int | None) -> Tensor: ...
    def scale(self, x: Tensor, factor: float) -> Tensor: ...  # x * factor
    def softcap(self, x: Tensor, cap: float) -> Tensor: ...  # cap * tanh(x / cap)
    # DFlash2. conv_prepare: [B, T, H] -> (filtered [B, T, H], the output side's taps [B, T, K, G]);
    # conv_finish: the sublayer's output filtered with those taps; select_path: greedy path [B, D]
    # of hidden [B, D, H] and logits [B, D, V] after anchor [B].
    def conv_prepare(self, x: Tensor, name: str, kernel: int, group: int) -> tuple[Tensor, Tensor]: ...
    def conv_finish(self, y: Tensor, taps: Tensor, name: str, group: int) -> Tensor: ...
    def select_path(self, hidden: Tensor, logits: Tensor, anchor: Tensor, name: str, top_k: int) -> Tensor: ...


def target_tap(ops: Ops, taps: Sequence[Tensor], eps: float) -> Tensor:
    """Fused context rows [B, T, H] from the target's layer outputs (each [B, T, H])."""
    return ops.rms_norm(ops.linear(ops.concat(taps), "dflash.fc"), "dflash.hidden_norm", eps)


def drafter_forward(ops: Ops, s: DrafterSpec, block: Tensor, blk_pos: Tensor, ctx: Tensor, ctx_pos: Tensor) -> Tensor:
    """block [B, T] token ids [anchor, mask...] at positions blk_pos [B, T]; ctx [B, Tc, H] the new
    fused context rows at positions ctx_pos [B, Tc]. Returns the logits of the mask slots [B, T-1, V]."""
    return drafter_logits(ops, s, drafter_hidden(ops, s, block, blk_pos, ctx, ctx_pos))


def drafter_hidden(ops: Ops, s: DrafterSpec, block: Tensor, blk_pos: Tensor, ctx: Tensor, ctx_pos: Tensor) -> Tensor:
    """drafter_forward up to the final norm: the mask slots' states [B, T-1, H]."""
    kv_width = s.num_kv_heads * s.head_dim
    x = ops.embed(block, "transformer.vocab_embedding")  # [B, T, H]
    if s.embedding_scale != 1.0:
        x = ops.scale(x, s.embedding_scale)
    for i in range(s.num_layers):
        p = f"transformer.layers.{i}."
        # The new context rows' keys and values join this layer's arena.
        k_ctx, v_ctx = ops.split(ops.linear(ctx, p + "attention.kv"), (kv_width, kv_width))  # [B, Tc, Hkv*D] each
        k_ctx = ops.rope(ops.rms_norm(ops.heads(k_ctx, s.num_kv_heads, s.head_dim), p + "attention.k_layernorm", s.eps),
                         ctx_pos)
        ops.inject(i, k_ctx, ops.heads(v_ctx, s.num_kv_heads, s.head_dim))
        # The block attends over [arena ; block] (DFlash2: inside its convolution).
        h = ops.rms_norm(x, p + "input_layernorm", s.eps)
        if s.conv_kernel:
            h, taps = ops.conv_prepare(h, p + "attention_conv", s.conv_kernel, s.conv_group)
        q = ops.rope(ops.rms_norm(ops.heads(ops.linear(h, p + "attention.q"), s.num_heads, s.head_dim),
                                  p + "attention.q_layernorm", s.eps), blk_pos)  # [B, T, Hq, D]
        k, v = ops.split(ops.linear(h, p + "attention.kv"), (kv_width, kv_width))
        k = ops.rope(ops.rms_norm(ops.heads(k, s.num_kv_heads, s.head_dim), p + "attention.k_layernorm", s.eps),
                     blk_pos)
        o = ops.attend(i, q, k, ops.heads(v, s.num_kv_heads, s.head_dim), s.causal[i], s.window[i])  # [B, T, Hq, D]
        a = ops.linear(ops.merge_heads(o), p + "attention.dense")  # [B, T, H] (all-reduced under tp)
        if s.conv_kernel:
            a = ops.conv_finish(a, taps, p + "attention_conv", s.conv_group)
        x = ops.add(x, a)
        h = ops.rms_norm(x, p + "post_layernorm", s.eps)
        if s.conv_kernel:
            h, taps = ops.conv_prepare(h, p + "mlp_conv", s.conv_kernel, s.conv_group)
        m = ops.linear(ops.silu_mul(ops.linear(h, p + "mlp.fc"), ops.linear(h, p + "mlp.gate")), p + "mlp.proj")
        if s.conv_kernel:
            m = ops.conv_finish(m, taps, p + "mlp_conv", s.conv_group)
        x = ops.add(x, m)
    return ops.drop_first_token(ops.rms_norm(x, "transformer.ln_f", s.eps))  # [B, T-1, H]


def drafter_logits(ops: Ops, s: DrafterSpec, hidden: Tensor) -> Tensor:
    """The mask slots' logits through the target's LM head [B, T-1, V], multiplied and soft-capped."""
    logits = ops.linear(hidden, "lm_head")
    if s.output_multiplier != 1.0:
        logits = ops.scale(logits, s.output_multiplier)
    return logits if s.softcap is None else ops.softcap(logits, s.softcap)


def drafter_path(ops: Ops, s: DrafterSpec, hidden: Tensor, logits: Tensor, anchor: Tensor) -> Tensor:
    """DFlash2: the selector's greedy path [B, T-1] (its drafts) after anchor [B]."""
    assert s.selector_top_k, "drafter_path is for DFlash2 drafters"
    return ops.select_path(hidden, logits, anchor, "dflash2.selector", s.selector_top_k)
