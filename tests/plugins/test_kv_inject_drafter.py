"""The reference drafter with the Triton kernel in place of its attention gives the same drafts.

trtllm_dflash.reference.draft.DraftAttention has no attention hook, so the test swaps its
forward for one that computes q / K / V exactly as it does and calls the kernel on the
drafter's own cache (a [B, Hkv, S, D] slab, read through a transposed view). Several
rounds of ragged context growth, with a full-attention layer and a causal sliding-window
layer whose window is shorter than the context, exercise every mask of the kernel.
"""

import pytest
import torch

from trtllm_dflash.reference import DFlashDraft, DraftConfig
from trtllm_dflash.reference.draft import DraftAttention
from trtllm_dflash.reference.rope import RopeConfig
from trtllm_dflash.reference.target import apply_rope

VOCAB, HIDDEN, BLOCK, WINDOW = 256, 64, 8, 12


def tiny_drafter(seed=0) -> DFlashDraft:
    cfg = DraftConfig(
        hidden_size=HIDDEN, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
        rms_norm_eps=1e-6, rope=RopeConfig(10000.0), max_position_embeddings=4096, block_size=BLOCK,
        target_layer_ids=(0, 2), mask_token_id=VOCAB - 1, num_target_layers=4,
        layer_types=("full_attention", "sliding_attention"), sliding_window=WINDOW,
    )
    torch.manual_seed(seed)
    model = DFlashDraft(cfg)
    with torch.no_grad():  # std 0.1 (not 0.02): peaked logits, so argmax has clear margins
        for name, p in model.named_parameters():
            p.normal_(0, 0.1) if not name.endswith("norm.weight") else p.fill_(1.0)
    return model.eval()


def kernel_forward(cfg: DraftConfig, launch, calls: list):
    """A DraftAttention.forward that runs `launch` (the Triton launcher) for the attention."""

    def forward(self, x, ctx, rope_blk, rope_ctx, cache, layer, blk_pos, ctx_pos, kv_len, mask, ctx_rows=None):
        B, T, _ = x.shape
        if ctx.shape[1]:
            cache.write(layer, ctx_pos, *self.kv(ctx, *rope_ctx), rows=ctx_rows)
        q = apply_rope(self.q_norm(self.q_proj(x).view(B, T, self.n_heads, self.head_dim)), *rope_blk)
        k_blk, v_blk = self.kv(x, *rope_blk)  # [B, T, Hkv, D]
        cache.write(layer, blk_pos, k_blk, v_blk)  # the reference's scratch write: keep both caches equal
        sliding = cfg.layer_types[layer] == "sliding_attention"
        window = cfg.sliding_window if sliding else None
        if sliding and not cfg.causal[layer] and T > window:
            raise NotImplementedError("a non-causal sliding layer also limits keys ahead; the kernel's window "
                                      "only limits keys behind (equivalent while T <= window)")
        start = blk_pos[:, 0].to(torch.int32)  # cache_lens: committed context positions
        calls.append((layer, cfg.causal[layer], window, start.tolist()))
        o = launch(q, k_blk, v_blk, cache.k[layer].transpose(1, 2), cache.v[layer].transpose(1, 2), start,
                   causal_block=cfg.causal[layer], window=window)  # [B, T, Hq, D]
        return self.o_proj(o.reshape(B, T, -1))

    return forward


def draft_rounds(drafter: DFlashDraft, lm_head: torch.nn.Linear, rounds: int = 5):
    """Drive the drafter like the decode loop: ragged new context each round. Returns per-round
    hidden states [B, T, H] and draft tokens [B, T-1]."""
    gen = torch.Generator().manual_seed(1)
    B, feat = 2, len(drafter.target_layer_ids) * HIDDEN
    cache = drafter.new_cache(B, 128)
    start = torch.tensor([20, 9])  # prompt lengths: context positions [0, start)
    prev = torch.zeros(B, dtype=torch.long)
    anchor = torch.randint(0, VOCAB - 1, (B,), generator=gen)
    embed = torch.randn(VOCAB, HIDDEN, generator=gen)
    out = []
    for _ in range(rounds):
        n = int((start - prev).max())
        j = torch.arange(n)[None, :]
        ctx_pos = torch.where(prev[:, None] + j < start[:, None], prev[:, None] + j, cache.trash)  # [B, n]
        ctx = torch.randn(B, n, feat, generator=gen)  # stand-in target features
        block = torch.full((B, BLOCK), drafter.mask_token_id)
        block[:, 0] = anchor
        with torch.inference_mode():
            hidden = drafter(embed[block], start, ctx, ctx_pos, cache)
        drafts = lm_head(hidden[:, 1:]).argmax(-1)
        out.append((hidden, drafts))
        accepted = torch.randint(0, BLOCK, (B,), generator=gen)  # ragged acceptance lengths
        prev, start = start, start + accepted + 1
        anchor = drafts[torch.arange(B), accepted.clamp_max(BLOCK - 2)]
    return out


def test_drafter_with_kernel_gives_the_same_drafts(kernel, monkeypatch):
    drafter = tiny_drafter()
    torch.manual_seed(2)
    lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    torch.nn.init.normal_(lm_head.weight, 0, 0.1)

    expected = draft_rounds(drafter, lm_head)
    calls = []
    monkeypatch.setattr(DraftAttention, "forward",
                        kernel_forward(drafter.cfg, kernel.kv_inject_attention_triton, calls))
    got = draft_rounds(drafter, lm_head)

    # Both layers ran through the kernel, the sliding one with a window shorter than the context.
    assert {(layer, causal, window) for layer, causal, window, _ in calls} == {(0, False, None), (1, True, WINDOW)}
    assert max(max(lens) for *_, lens in calls) > 2 * WINDOW
    for r, ((h_ref, d_ref), (h_k, d_k)) in enumerate(zip(expected, got)):
        # fp32 on both sides; only the summation order differs.
        torch.testing.assert_close(h_k, h_ref, atol=1e-5, rtol=1e-5, msg=lambda m: f"round {r}: {m}")
        assert torch.equal(d_k, d_ref), f"round {r}: drafts {d_k.tolist()} != {d_ref.tolist()}"
    assert len({tuple(d.flatten().tolist()) for _, d in expected}) > 1  # drafts vary: not a trivial pass


def test_kernel_forward_is_what_the_reference_computes():
    """The adapter above with the *reference* attention reproduces the drafter bit for bit, so a
    mismatch in the kernel test can only come from the kernel."""
    from trtllm_dflash.plugins.kv_inject_attention import kv_inject_attention_reference

    drafter = tiny_drafter(seed=3)
    lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    expected = draft_rounds(drafter, lm_head, rounds=3)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DraftAttention, "forward", kernel_forward(drafter.cfg, kv_inject_attention_reference, []))
        got = draft_rounds(drafter, lm_head, rounds=3)
    for (h_ref, d_ref), (h, d) in zip(expected, got):
        torch.testing.assert_close(h, h_ref, atol=1e-5, rtol=1e-5)
        assert torch.equal(d, d_ref)
