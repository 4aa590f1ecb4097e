"""The engine backend's two DFlash networks, written once over a small op set.

  target_tap      the target engine's extra output: the fused context row of every token,
                  hidden_norm(fc(concat(outputs of target_layer_ids)))  [N, H]
                  (design C: the target engine computes it in-graph, so only H floats per
                  token leave the engine instead of n*H)
  drafter_forward the drafter engine: one pass over the block [anchor, mask x (T-1)] whose
                  attention is the KV-injection plugin over the per-layer context cache
                  (the arena), after the new context rows' K/V are appended to it

Weights are named as the convert stage writes the drafter checkpoint (convert/weight_maps.py
DRAFTER_MAP: `transformer.layers.{i}.attention.q`, fused `attention.kv`, `mlp.fc` = gate,
`mlp.gate` = up, ...). Two implementations of `Ops`:
  TorchOps   (build/ops_torch.py)    torch tensors; runs on CPU; proven token-exact against
                                     the reference drafter on the shipped pair
  TrtllmOps  (build/ops_trtllm.py)   TensorRT-LLM 1.2.1's functional API plus our AOT
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

    @classmethod
    def from_config(cls, cfg) -> "DrafterSpec":
        """From a reference DraftConfig."""
        window = tuple(cfg.sliding_window if kind == "sliding_attention" else None for kind in cfg.layer_types)
        return cls(cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps, tuple(cfg.causal),
                   window, cfg.attention_bias)


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


def target_tap(ops: Ops, taps: Sequence[Tensor], eps: float) -> Tensor:
    """Fused context rows [B, T, H] from the target's layer outputs (each [B, T, H])."""
    return ops.rms_norm(ops.linear(ops.concat(taps), "dflash.fc"), "dflash.hidden_norm", eps)


def drafter_forward(ops: Ops, s: DrafterSpec, block: Tensor, blk_pos: Tensor, ctx: Tensor, ctx_pos: Tensor) -> Tensor:
    """block [B, T] token ids [anchor, mask...] at positions blk_pos [B, T]; ctx [B, Tc, H] the new
    fused context rows at positions ctx_pos [B, Tc]. Returns the logits of the mask slots [B, T-1, V]."""
    kv_width = s.num_kv_heads * s.head_dim
    x = ops.embed(block, "transformer.vocab_embedding")  # [B, T, H]
    for i in range(s.num_layers):
        p = f"transformer.layers.{i}."
        # The new context rows' keys and values join this layer's arena.
        k_ctx, v_ctx = ops.split(ops.linear(ctx, p + "attention.kv"), (kv_width, kv_width))  # [B, Tc, Hkv*D] each
        k_ctx = ops.rope(ops.rms_norm(ops.heads(k_ctx, s.num_kv_heads, s.head_dim), p + "attention.k_layernorm", s.eps), ctx_pos)
        ops.inject(i, k_ctx, ops.heads(v_ctx, s.num_kv_heads, s.head_dim))
        # The block attends over [arena ; block].
        h = ops.rms_norm(x, p + "input_layernorm", s.eps)
        q = ops.rope(ops.rms_norm(ops.heads(ops.linear(h, p + "attention.q"), s.num_heads, s.head_dim),
                                  p + "attention.q_layernorm", s.eps), blk_pos)  # [B, T, Hq, D]
        k, v = ops.split(ops.linear(h, p + "attention.kv"), (kv_width, kv_width))
        k = ops.rope(ops.rms_norm(ops.heads(k, s.num_kv_heads, s.head_dim), p + "attention.k_layernorm", s.eps), blk_pos)
        o = ops.attend(i, q, k, ops.heads(v, s.num_kv_heads, s.head_dim), s.causal[i], s.window[i])  # [B, T, Hq, D]
        x = ops.add(x, ops.linear(ops.merge_heads(o), p + "attention.dense"))
        h = ops.rms_norm(x, p + "post_layernorm", s.eps)
        x = ops.add(x, ops.linear(ops.silu_mul(ops.linear(h, p + "mlp.fc"), ops.linear(h, p + "mlp.gate")), p + "mlp.proj"))
    x = ops.rms_norm(x, "transformer.ln_f", s.eps)
    return ops.linear(ops.drop_first_token(x), "lm_head")  # [B, T-1, V]
