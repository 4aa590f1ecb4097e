"""The networks written once (runtime/networks.py) on torch (runtime/ops_torch.py) against the
reference modules, on the shipped tiny-pystd pair in fp32:

- target_tap: the fused context rows equal the reference drafter's hidden_norm(fc(features));
- drafter_forward over an Arena equals the reference DFlashDraft over its KV cache: the same
  draft tokens, logits within 1e-5 (fp32: two attention implementations, SDPA and the
  KV-injection plugin's float32 reference, differ by rounding only), over rounds of ragged
  context growth like the decode loop's;
- the same for a DFlash2 drafter (convolutions, selector path, logit scalars).
"""

from pathlib import Path

import torch

from trtllm_dflash.prompts.sources import heldout_token_prompts
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.reference import SamplingParams, load_pair
from trtllm_dflash.reference.runners import PAD, ReferenceDrafter, ReferenceTarget
from trtllm_dflash.runtime.engine_runners import drafter_weights
from trtllm_dflash.runtime.networks import DrafterSpec, drafter_hidden, drafter_logits, drafter_path, target_tap
from trtllm_dflash.runtime.ops_torch import Arena, TorchOps

TOL = 1e-5
FIXTURE = Path(__file__).parents[1] / "fixtures" / "dflash2"


def test_networks_reproduce_the_reference_drafter_on_the_shipped_pair():
    recipe = load_recipe(None)
    target, drafter = load_pair(recipe.target.path, recipe.drafter.path)
    _compare(target, drafter, heldout_token_prompts(recipe.target.path, 3, 48))


def test_networks_reproduce_a_dflash2_drafter(tmp_path):
    """z-lab's DFlash2 layout (tests/fixtures/dflash2: convolutions, selector, a sliding and a full
    non-causal layer, logit multiplier, soft-cap and embedding scale): logits within 1e-5 and the
    selector's greedy path (drafter_path) equal to the reference drafter's. The sliding window is
    widened from 6 to the block size 8: the plugin limits keys behind the query only, so a
    non-causal window shorter than the block is not on the engine path (z-lab's are 2048)."""
    import json
    import shutil

    shutil.copytree(FIXTURE / "drafter", tmp_path / "drafter")
    cfg = json.loads((tmp_path / "drafter" / "config.json").read_text())
    (tmp_path / "drafter" / "config.json").write_text(json.dumps({**cfg, "sliding_window": 8}))
    target, drafter = load_pair(FIXTURE / "target", tmp_path / "drafter")
    g = torch.Generator().manual_seed(1)
    _compare(target, drafter, [torch.randint(0, 95, (n,), generator=g).tolist() for n in (20, 9, 33)])


def _compare(target, drafter, prompts):
    """drafter_forward (and for DFlash2 drafter_path) over an Arena against the reference drafter
    over its KV cache, for 4 rounds of ragged context growth."""
    w = drafter_weights(target, drafter)
    d = drafter.cfg
    spec, T, B = DrafterSpec.from_config(d), d.block_size, len(prompts)
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
            block = torch.cat([anchor[:, None], torch.full((B, T - 1), d.mask_token_id)], dim=1)
            ops = TorchOps(w, drafter.rope, arena, new.to(torch.int32))
            hidden = drafter_hidden(ops, spec, block, start[:, None] + torch.arange(T),
                                    target_tap(TorchOps(w), [ctx], d.rms_norm_eps), ctx_pos.clamp(min=0))
            ours = drafter_logits(ops, spec, hidden)
            arena.lens = arena.lens + new.to(torch.int32)
            ref = ref_d.draft(anchor, start, ctx, ctx_pos, T)  # [B, T-1, V]
            drafts = ref.argmax(-1)
            if d.dflash2:  # the same pass again (it rewrites the same cache slots): the selector's path
                drafts, _ = ref_d.draft_path(anchor, start, ctx, ctx_pos, T, SamplingParams(), None)
                assert torch.equal(drafter_path(ops, spec, hidden, ours, anchor), drafts)
            else:
                assert torch.equal(ours.argmax(-1), drafts)
            assert (ours - ref).abs().max() <= TOL * max(1.0, ref.abs().max().item())
            # next round: a ragged number of accepted positions per row, with stand-in features
            new = torch.randint(1, T, (B,), generator=gen)
            j = torch.arange(int(new.max()))[None, :]
            ctx_pos = torch.where(j < new[:, None], start[:, None] + j, PAD)
            ctx = torch.randn(B, j.shape[1], feats.shape[-1], generator=gen)
            anchor = drafts[:, 0]
            start = start + new
