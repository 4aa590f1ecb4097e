"""The DFlash drafter: z-lab checkpoint layout, config variants, cached drafting, and a
cross-check against z-lab's own implementation (PyPI dflash==0.1.0) on the same checkpoint."""

import json

import pytest
import torch
from safetensors import safe_open

from reference_helpers import make_drafter
from trtllm_dflash.reference import DraftConfig, load_drafter, load_target
from trtllm_dflash.reference.config import default_target_layer_ids

# fp32, identical op order up to SDPA masking: observed max |diff| is 0; 1e-5 leaves
# room for a different SDPA kernel choice.
TOL = dict(rtol=1e-5, atol=1e-5)


def zlab_names(n_layers):
    names = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    for i in range(n_layers):
        p = f"layers.{i}."
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        names |= {f"{p}self_attn.{x}_proj.weight" for x in "qkvo"}
        names |= {f"{p}self_attn.{x}_norm.weight" for x in "qk"}
        names |= {f"{p}mlp.{x}_proj.weight" for x in ("gate", "up", "down")}
    return names


def test_saved_layout_is_zlab(qwen3_pair):
    target_dir, drafter_dir = qwen3_pair
    with safe_open(drafter_dir / "model.safetensors", "pt") as f:
        assert set(f.keys()) == zlab_names(2)
        assert f.get_slice("fc.weight").get_shape() == [64, 2 * 64]
    cfg = json.loads((drafter_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen3" and cfg["block_size"] == 8 and cfg["num_target_layers"] == 4
    assert cfg["dflash_config"] == {"target_layer_ids": [0, 2], "mask_token_id": 255}
    drafter = load_drafter(drafter_dir, load_target(target_dir))
    with safe_open(drafter_dir / "model.safetensors", "pt") as f:
        for name, value in drafter.state_dict().items():
            assert torch.equal(value, f.get_tensor(name)), name


def test_config_variants():
    base = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "rope_theta": 1e6, "num_target_layers": 36}
    # block_size inside dflash_config; target_layer_ids from z-lab's default rule
    cfg = DraftConfig.from_dict({**base, "num_hidden_layers": 5,
                                 "dflash_config": {"block_size": 16, "mask_token_id": 7}})
    assert cfg.block_size == 16 and cfg.target_layer_ids == (1, 9, 17, 25, 33) and cfg.mask_token_id == 7
    # sliding layers are causal by default; is_causal overrides every layer
    cfg = DraftConfig.from_dict({**base, "block_size": 8, "layer_types": ["sliding_attention", "full_attention"],
                                 "sliding_window": 4, "dflash_config": {"mask_token_id": 1, "target_layer_ids": [3]}})
    assert cfg.causal == (True, False) and cfg.sliding_window == 4 and cfg.rope.theta == 1e6
    cfg = DraftConfig.from_dict({**base, "block_size": 8, "is_causal": True, "dflash_config": {"mask_token_id": 1}})
    assert cfg.causal == (True, True)
    assert DraftConfig.from_dict(cfg.to_dict()) == cfg


def test_default_layer_ids_match_published_drafts():
    # Published z-lab configs (docs/design/upstream-facts.md).
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(32, 5) == [1, 8, 15, 22, 29]
    assert default_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]
    assert default_target_layer_ids(36, 1) == [18]


def _draft_once(drafter, target, feats, P, block):
    cache = drafter.new_cache(1, 64)
    noise = target.embed_tokens(block)
    return drafter(noise, torch.tensor([P]), feats[:, :P], torch.arange(P)[None], cache)


@pytest.mark.parametrize("variant", ["full", "sliding"])
def test_incremental_context_equals_one_shot(tmp_path, qwen3_pair, variant):
    """Feeding the context in pieces over rounds (with stale block K/V in the cache
    between them) gives the same block output as one pass over all of it."""
    target_dir, _ = qwen3_pair
    kw = {"layer_types": ("sliding_attention", "full_attention"), "sliding_window": 5} if variant == "sliding" else {}
    target = load_target(target_dir)
    drafter = load_drafter(make_drafter(tmp_path, target_dir, **kw), target)
    feats = torch.randn(1, 12, 128, generator=torch.Generator().manual_seed(0))
    block = torch.tensor([[9] + [255] * 7])
    with torch.no_grad():
        ref = _draft_once(drafter, target, feats, 12, block)
        cache = drafter.new_cache(1, 64)
        noise = target.embed_tokens(block)
        for a, b in [(0, 5), (5, 6), (6, 12)]:  # three rounds: 5, 1, 6 new context positions
            out = drafter(noise, torch.tensor([b]), feats[:, a:b], torch.arange(a, b)[None], cache)
    torch.testing.assert_close(out, ref, **TOL)


@pytest.mark.parametrize("variant", ["full", "sliding"])
def test_matches_upstream_dflash(tmp_path, qwen3_pair, variant):
    """z-lab's DFlashDraftModel (PyPI dflash==0.1.0) loads our saved checkpoint unchanged
    and produces the same draft logits, over two rounds with its own DynamicCache."""
    dflash_model = pytest.importorskip(
        "dflash.model", reason="z-lab's dflash==0.1.0 is not installed (pip install --no-deps dflash==0.1.0)"
    )
    from transformers import DynamicCache

    target_dir, _ = qwen3_pair
    kw = {"layer_types": ("sliding_attention", "full_attention"), "sliding_window": 5} if variant == "sliding" else {}
    drafter_dir = make_drafter(tmp_path, target_dir, seed=3, **kw)
    target = load_target(target_dir)
    ours = load_drafter(drafter_dir, target)
    theirs = dflash_model.DFlashDraftModel.from_pretrained(drafter_dir, dtype=torch.float32).eval()
    assert (theirs.block_size, theirs.mask_token_id, list(theirs.target_layer_ids)) == (8, 255, [0, 2])
    feats = torch.randn(1, 14, 128, generator=torch.Generator().manual_seed(1))
    ours_cache, their_cache = ours.new_cache(1, 64), DynamicCache(config=theirs.config)
    their_cache.activate_past_recording()  # as upstream's _make_cache does
    with torch.no_grad():
        for a, b in [(0, 9), (9, 13)]:  # two rounds: prompt context, then 4 accepted positions
            noise = target.embed_tokens(torch.tensor([[3 + b] + [255] * 7]))
            mine = target.lm_head(ours(noise, torch.tensor([b]), feats[:, a:b], torch.arange(a, b)[None], ours_cache))
            ref = theirs(target_hidden=feats[:, a:b], noise_embedding=noise, position_ids=torch.arange(a, b + 8)[None],
                         past_key_values=their_cache, use_cache=True)
            their_cache.crop(b - their_cache.get_seq_length())  # keep context only, as upstream's loop does
            torch.testing.assert_close(mine[:, 1:], target.lm_head(ref)[:, 1:], **TOL)


def test_ragged_batch_equals_single(tmp_path, qwen3_pair):
    """Rows with different anchors, context lengths and padding (-> cache.trash) draft
    exactly what each row drafts alone, through a causal sliding-window layer too; only the real
    context rows are projected (a joining request's prompt made every row project its length)."""
    target_dir, _ = qwen3_pair
    target = load_target(target_dir)
    kw = {"layer_types": ("sliding_attention", "full_attention"), "sliding_window": 5}
    drafter = load_drafter(make_drafter(tmp_path, target_dir, **kw), target)
    g = torch.Generator().manual_seed(2)
    rounds = [(0, 9), (9, 12)], [(0, 4), (4, 9)]  # per row: (first, end) context positions per round
    feats = [torch.randn(1, 12, 128, generator=g), torch.randn(1, 9, 128, generator=g)]
    anchors = [17, 23]
    with torch.no_grad():
        alone = []
        for row in range(2):
            cache = drafter.new_cache(1, 64)
            for a, b in rounds[row]:
                noise = target.embed_tokens(torch.tensor([[anchors[row] + b] + [255] * 7]))
                out = drafter(noise, torch.tensor([b]), feats[row][:, a:b], torch.arange(a, b)[None], cache)
            alone.append(out)
        projected = []
        drafter.fc.register_forward_hook(lambda _m, args, _out: projected.append(args[0].shape[:-1].numel()))
        cache = drafter.new_cache(2, 64)
        for r in range(2):
            spans = [rounds[row][r] for row in range(2)]
            n = max(b - a for a, b in spans)
            ctx = torch.zeros(2, n, 128)
            pos = torch.full((2, n), cache.trash)
            for row, (a, b) in enumerate(spans):
                ctx[row, : b - a] = feats[row][0, a:b]
                pos[row, : b - a] = torch.arange(a, b)
            starts = torch.tensor([b for _, b in spans])
            noise = target.embed_tokens(torch.tensor([[anchors[row] + b] + [255] * 7
                                                      for row, (_, b) in enumerate(spans)]))
            out = drafter(noise, starts, ctx, pos, cache)
    torch.testing.assert_close(out, torch.cat(alone), **TOL)
    assert projected == [9 + 4, 3 + 5]  # each round's real rows, not 2 x the longest
