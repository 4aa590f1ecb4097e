"""ArenaDrafter: the DrafterRunner over a drafter *engine* (formats/engine_io.py I/O), whatever runs
the engine: the TensorRT runtime (runtime/trt_runners.py TrtSession, GPU) or TorchDrafterSession
below (the same contract on torch, CPU: how the runner is tested without a GPU).

The runner owns the arena (runtime/ops_torch.py Arena: per layer k, v [B, S_max, Hkv, D] and the
lengths) and binds each layer's `k_cache_{l}` input and `present_k_cache_{l}` output to the
same buffer (likewise v), so the engine's append plugin writes this step's rows in place.
Per draft call it packs the inputs (block [anchor, mask x (T-1)] and its positions, the new
context rows padded to the longest, their positions, counts, the cached lengths), checks on the
host that the context stays contiguous and fits the arena (the engine cannot), runs one step,
then advances the lengths. Result: the `draft_logits` output [B, T-1, V].
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Protocol

import torch

from trtllm_dflash.formats.engine_io import arena_names
from trtllm_dflash.reference.runners import PAD
from trtllm_dflash.runtime.ops_torch import Arena


class DrafterSession(Protocol):
    """One drafter engine: run(named inputs, named outputs) writes the outputs in place."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype: torch.dtype  # activations (ctx_rows, draft_logits)
    kv_dtype: torch.dtype  # the arena
    device: torch.device
    max_len: int  # the most arena rows per sequence the engine takes (its max_seq_len)

    def run(self, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None: ...


class ArenaDrafter:
    """DrafterRunner (reference/runners.py) over a DrafterSession."""

    def __init__(self, session: DrafterSession, *, block_size: int, mask_token_id: int,
                 target_layer_ids: tuple[int, ...], max_len: int):
        self.session = session
        self.block_size, self.mask_token_id, self.target_layer_ids = block_size, mask_token_id, target_layer_ids
        self.max_len = min(max_len, session.max_len)
        self.arena = Arena(session.num_layers, session.num_kv_heads, session.head_dim, self.max_len, session.kv_dtype,
                           session.device)
        self.lens: list[int] = []  # host copy of arena.lens (checks without a device sync)

    def join(self, n):
        self.arena.join(n)
        self.lens += [0] * n

    def keep(self, idx):
        self.arena.keep(idx)
        self.lens = [self.lens[i] for i in idx]

    @torch.inference_mode()
    def draft(self, anchor, start, ctx, ctx_pos, T):
        dev, B = self.session.device, anchor.shape[0]
        new = (ctx_pos != PAD).sum(1).to(torch.int32)  # valid rows are a prefix of each row
        new_h, start_h = new.tolist(), start.tolist()
        for b in range(B):
            if self.lens[b] + new_h[b] != start_h[b]:
                raise RuntimeError(f"drafter row {b}: {self.lens[b]} cached + {new_h[b]} new context rows, but the "
                                   f"anchor is at position {start_h[b]}: the context is not contiguous")
            if start_h[b] > self.max_len:
                raise RuntimeError(f"drafter row {b}: {start_h[b]} context rows exceed the arena's {self.max_len}")
        if ctx.shape[1] == 0:  # the engine takes at least one (padding) row
            ctx, ctx_pos = ctx.new_zeros(B, 1, ctx.shape[2]), ctx_pos.new_full((B, 1), PAD)
        block = torch.full((B, T), self.mask_token_id, dtype=torch.int32, device=dev)
        block[:, 0] = anchor.to(dev)
        inputs = {
            "block_ids": block,
            "block_positions": (start.to(dev)[:, None] + torch.arange(T, device=dev)).to(torch.int32),
            "ctx_rows": ctx.to(dev, self.session.dtype).contiguous(),
            "ctx_positions": ctx_pos.clamp(min=0).to(dev, torch.int32).contiguous(),
            "new_ctx_lens": new.to(dev),
            "cache_lens": self.arena.lens.to(torch.int32).contiguous(),
        }
        outputs = {"draft_ids": torch.empty(B, T - 1, dtype=torch.int32, device=dev),
                   "draft_logits": torch.empty(B, T - 1, self.session.vocab_size, dtype=self.session.dtype, device=dev)}
        caches = [c for layer in range(self.session.num_layers) for c in (self.arena.k[layer], self.arena.v[layer])]
        for (inp, out), cache in zip(arena_names(self.session.num_layers), caches):
            inputs[inp] = outputs[out] = cache  # one buffer: the append plugin writes this step's rows in place
        self.session.run(inputs, outputs)
        self.arena.lens = self.arena.lens + inputs["new_ctx_lens"]
        self.lens = [n + m for n, m in zip(self.lens, new_h)]
        return outputs["draft_logits"]


class TorchDrafterSession:
    """The drafter engine's contract on torch (CPU): runtime/networks.py drafter_forward with
    TorchOps over the bound arena buffers (TorchOps' append writes them in place, as the engine's
    kv_append plugin does)."""

    def __init__(self, weights: dict[str, torch.Tensor], spec, rope, *, max_len: int, comm=None):
        from trtllm_dflash.runtime.ops_torch import SingleRank

        emb = weights["transformer.vocab_embedding.weight"]
        self.w, self.spec, self.rope, self.comm = weights, spec, rope, comm or SingleRank()
        self.num_layers, self.num_kv_heads, self.head_dim = spec.num_layers, spec.num_kv_heads, spec.head_dim
        self.vocab_size = weights["lm_head.weight"].shape[0] * self.comm.world
        self.dtype = self.kv_dtype = emb.dtype
        self.device, self.max_len = emb.device, max_len

    def run(self, inputs, outputs):
        from trtllm_dflash.runtime.networks import drafter_forward
        from trtllm_dflash.runtime.ops_torch import TorchOps

        names = arena_names(self.num_layers)
        arena = SimpleNamespace(k=[inputs[i] for i, _ in names[0::2]], v=[inputs[i] for i, _ in names[1::2]],
                                lens=inputs["cache_lens"])
        ops = TorchOps(self.w, self.rope, arena, inputs["new_ctx_lens"], self.comm)
        logits = drafter_forward(ops, self.spec, inputs["block_ids"].long(), inputs["block_positions"].long(),
                                 inputs["ctx_rows"], inputs["ctx_positions"].long())
        outputs["draft_logits"].copy_(logits)
        outputs["draft_ids"].copy_(logits.argmax(-1))
        for i, o in names:
            if outputs[o] is not inputs[i]:
                outputs[o].copy_(inputs[i])
