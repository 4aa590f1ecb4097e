"""The networks written once (build/networks.py) on torch (build/ops_torch.py) against the
reference modules, on the shipped tiny-pystd pair in fp32:

- target_tap: the fused context rows equal the reference drafter's hidden_norm(fc(features));
- drafter_forward over an Arena equals the reference DFlashDraft over its KV cache: the same
  draft tokens, logits within 1e-5 (fp32: two attention implementations, SDPA and the
  KV-injection plugin's float32 reference, differ by rounding only), over rounds of ragged
  context growth like the decode loop's.
"""

import torch

from trtllm_dflash.build.networks import DrafterSpec, drafter_forward, target_tap
from trtllm_dflash.build.ops_torch import Arena, TorchOps
from trtllm_dflash.prompts.sources import heldout_token_prompts
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.reference import load_pair
from trtllm_dflash.reference.runners import PAD, ReferenceDrafter, ReferenceTarget
from trtllm_dflash.serve.engine_runners import drafter_weights

TOL = 1e-5


def test_networks_reproduce_the_reference_drafter_on_the_shipped_pair():
    recipe = load_recipe(None)
    target, drafter = load_pair(recipe.target.path, recipe.drafter.path)
    w = drafter_weights(target, drafter)
    d = drafter.cfg
    spec, T, B = DrafterSpec.from_config(d), d.block_size, 3
    prompts = heldout_token_prompts(recipe.target.path, B, 48)
    ref_t = ReferenceTarget(target, d.target_layer_ids, 200)
    ref_d = ReferenceDrafter(drafter, target, 200)
    arena = Arena(spec.num_layers, spec.num_kv_heads, spec.head_dim, 200, torch.float32)
    ref_d.join(B)
    arena.join(B)
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        _, feats = ref_t.prefill(prompts)  # [B, P, n*H]: the prompts' target features
        fused = target_tap(TorchOps(w), [feats], d.rms_norm_eps)
        assert (fused - drafter.hidden_norm(drafter.fc(feats))).abs().max() <= TOL
        lens = [len(p) for p in prompts]
        start = torch.tensor(lens)
        new = torch.tensor(lens)  # context rows appended this round
        pos = torch.arange(feats.shape[1]).expand(B, -1)
        ctx, ctx_pos = feats, torch.where(pos < start[:, None], pos, PAD)
        anchor = torch.tensor([p[-1] for p in prompts])
        for _ in range(4):
            ref = ref_d.draft(anchor, start, ctx, ctx_pos, T)  # [B, T-1, V]
            block = torch.cat([anchor[:, None], torch.full((B, T - 1), d.mask_token_id)], dim=1)
            ops = TorchOps(w, drafter.rope, arena, new.to(torch.int32))
            ours = drafter_forward(ops, spec, block, start[:, None] + torch.arange(T), target_tap(TorchOps(w), [ctx], d.rms_norm_eps),
                                   ctx_pos.clamp(min=0))
            arena.lens = arena.lens + new.to(torch.int32)
            assert (ours - ref).abs().max() <= TOL * max(1.0, ref.abs().max().item())
            assert torch.equal(ours.argmax(-1), ref.argmax(-1))
            # next round: a ragged number of accepted positions per row, with stand-in features
            new = torch.randint(1, T, (B,), generator=gen)
            j = torch.arange(int(new.max()))[None, :]
            ctx_pos = torch.where(j < new[:, None], start[:, None] + j, PAD)
            ctx = torch.randn(B, j.shape[1], feats.shape[-1], generator=gen)
            anchor = ref.argmax(-1)[:, 0]
            start = start + new
