"""Laguna DFlash drafters (poolside's DFlashLagunaForCausalLM), one support row plus its weight map.

What a Laguna drafter adds, as TensorRT-LLM's tensorrt_llm/_torch/models/modeling_dflash.py
(PR #15666) and vLLM's laguna_dflash.py run it: an RMSNorm per fused target layer before fc, the
context through each layer's input_layernorm before its K/V projection, and a per-head softplus
gate on the attention output (g_proj on the block's normed attention input). Checked here against
a direct computation of one layer, through the decode loop (greedy output = the target's), convert
(tp 1 and 2) and the backends that refuse it.
"""

import dataclasses
import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from checkpoints import LAGUNA, VOCAB, make_drafter, make_target, read_config, step_tokens, write_recipe
from trtllm_dflash.convert.convert import convert
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.recipe.support import BACKENDS, DRAFTERS
from trtllm_dflash.reference import DFlashDraft, DraftConfig, generate, load_pair
from trtllm_dflash.reference.config import LAGUNA_ARCH
from trtllm_dflash.runtime.checkpoint import load_rank, read_checkpoint
from trtllm_dflash.runtime.checkpoint_runner import checkpoint_steps
from trtllm_dflash.runtime.tp_layers import Comm

PROMPTS = [[5, 9, 2, 77, 31, 4, 4, 18], [8, 8, 100, 3]]


@pytest.fixture(scope="module")
def laguna_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("laguna")
    return make_target(root / "target", "qwen3"), make_drafter(root / "drafter", **LAGUNA)


def laguna_config(**kw) -> dict:
    d = json.loads(json.dumps(LAGUNA))
    base = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, block_size=8, num_target_layers=4, vocab_size=VOCAB)
    return {**base, **d, **kw}


def test_a_laguna_config_reads_as_one_and_writes_back():
    cfg = DraftConfig.from_dict(laguna_config())
    assert (cfg.laguna, cfg.gate, cfg.variant, cfg.causal) == (True, True, "laguna", (True, True))
    back = cfg.to_dict()
    assert back["architectures"] == [LAGUNA_ARCH] and back["gating"] == "per-head"
    assert DraftConfig.from_dict(back) == cfg
    ungated = DraftConfig.from_dict(laguna_config(gating="disabled"))
    assert ungated.laguna and not ungated.gate
    assert DraftConfig.from_dict({**laguna_config(), "architectures": ["DFlashDraftModel"]}).variant == "dflash"


@pytest.mark.parametrize("change,message", [
    ({"gating": "per-element"}, "gating is 'per-element'"),
    ({"num_attention_heads_per_layer": [4, 8]}, "num_attention_heads_per_layer"),
    ({"num_attention_heads_per_layer": 4}, "num_attention_heads_per_layer is 4"),
    ({"num_experts": 4, "mlp_layer_types": ["dense", "sparse"]}, "mlp_layer_types has 'sparse'"),
    ({"num_experts": "four"}, "num_experts"),
    ({"draft_vocab_size": 100}, "draft_vocab_size 100 differs from vocab_size 256"),
    ({"rope_parameters": {"full_attention": {"rope_theta": 1e4}, "sliding_attention": {"rope_theta": 1e4}}},
     "rope_parameters per layer type"),
])
def test_what_we_do_not_run_of_laguna_is_refused_by_field(change, message):
    with pytest.raises(UserError, match=message):
        DraftConfig.from_dict(laguna_config(**change), "drafter config.json")


def random_laguna(seed: int = 0) -> DFlashDraft:
    d = DFlashDraft(DraftConfig.from_dict(laguna_config()))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in d.named_parameters():
            p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g) if "norm" in name
                    else 0.2 * torch.randn(p.shape, generator=g))
    return d.eval()


def test_one_layer_equals_the_laguna_formula():
    """Layer 0 of a drafter pass over fresh context, against the computation written out: keys and
    values of [input_layernorm(context) ; normed block], causal over the block, each head's output
    times softplus(g_proj(normed block)), then o_proj and the MLP."""
    d = random_laguna()
    layer, at = d.layers[0], d.layers[0].self_attn
    g = torch.Generator().manual_seed(1)
    Tc, T, H, Hq, Hkv, D = 5, 8, 64, 4, 2, 16
    x = torch.randn(1, T, H, generator=g)  # [1, T, H] block
    ctx = torch.randn(1, Tc, H, generator=g)  # [1, Tc, H] fused context
    ctx_pos, blk_pos = torch.arange(Tc)[None], Tc + torch.arange(T)[None]
    cache = d.new_cache(1, Tc + T)
    mask = d.masks(torch.tensor([Tc]), T, Tc + T)[0]
    with torch.no_grad():
        got = layer(x, ctx, d.rope(blk_pos, x.dtype), d.rope(ctx_pos, x.dtype), cache, 0, blk_pos, ctx_pos, Tc + T,
                    mask)

        from trtllm_dflash.reference.target import apply_rope

        h = layer.input_layernorm(x)
        kv_in = torch.cat([layer.input_layernorm(ctx), h], 1)  # [1, Tc+T, H]
        pos = torch.arange(Tc + T)[None]
        cos, sin = d.rope(pos, x.dtype)
        q = apply_rope(at.q_norm(at.q_proj(h).view(1, T, Hq, D)), *d.rope(blk_pos, x.dtype))
        k = apply_rope(at.k_norm(at.k_proj(kv_in).view(1, Tc + T, Hkv, D)), cos, sin)
        v = at.v_proj(kv_in).view(1, Tc + T, Hkv, D)
        k, v = (t.repeat_interleave(Hq // Hkv, 2).transpose(1, 2) for t in (k, v))  # [1, Hq, S, D]
        s = q.transpose(1, 2) @ k.transpose(-1, -2) / math.sqrt(D)  # [1, Hq, T, S]
        qp, kp = blk_pos[0][:, None], pos[0][None, :]
        s = s.masked_fill(~((kp <= qp) & (qp - kp < 6)), float("-inf"))  # causal, window 6
        o = (s.softmax(-1) @ v).transpose(1, 2)  # [1, T, Hq, D]
        o = o * torch.nn.functional.softplus(at.g_proj(h))[..., None]
        y = x + at.o_proj(o.reshape(1, T, Hq * D))
        want = y + layer.mlp(layer.post_attention_layernorm(y))
    # fp32, the same ops in another order: ~1e-6 relative.
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_each_target_layers_features_are_normed_on_their_own():
    """Scaling one target layer's features changes nothing (an RMSNorm per layer before fc); a
    DFlash drafter of the same weights sees the change."""
    d = random_laguna()
    plain = DFlashDraft(dataclasses.replace(d.cfg, laguna=False, gate=False))
    plain.load_state_dict({k: v for k, v in d.state_dict().items()
                           if not k.startswith("aux_hidden_norms") and "g_proj" not in k})
    feats = torch.randn(1, 5, 128, generator=torch.Generator().manual_seed(2))  # [1, Tc, 2*H]
    scaled = torch.cat([feats[..., :64] * 7.0, feats[..., 64:]], -1)
    torch.testing.assert_close(d.fuse(scaled), d.fuse(feats), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(plain.fc(plain.fuse(scaled)), plain.fc(plain.fuse(feats)), atol=1e-3)


@pytest.mark.parametrize("mode", ["dflash", "ddtree"])
def test_greedy_decoding_with_a_laguna_drafter_is_the_targets(laguna_pair, mode):
    target, drafter = load_pair(*laguna_pair)
    assert drafter.cfg.laguna and drafter.layers[0].self_attn.g_proj is not None
    want = [g.tokens for g in generate(target, None, PROMPTS, 24, mode="ar", stop_token_ids=[])]
    got = generate(target, drafter, PROMPTS, 24, mode=mode, ddtree_budget=12, stop_token_ids=[])
    assert [g.tokens for g in got] == want


@pytest.mark.slow
def test_convert_maps_the_laguna_tensors_and_the_reference_backend_serves_them(tmp_path, laguna_pair):
    target, drafter = laguna_pair
    one = convert(load_recipe(write_recipe(tmp_path / "r1.yaml", target, drafter)), tmp_path / "c1", progress=False)
    assert read_config(one / "drafter")["hf_config"]["architectures"] == [LAGUNA_ARCH]
    _, d_mem = load_pair(target, drafter)
    _, d_ckpt = load_rank(read_checkpoint(one), Comm())
    for name, p in d_mem.state_dict().items():  # every tensor back under its name, g_proj and aux norms included
        assert torch.equal(d_ckpt.state_dict()[name], p), name
    t_mem, _ = load_pair(target, drafter)
    want = [g.tokens for g in generate(t_mem, None, PROMPTS, 20, mode="ar", stop_token_ids=[])]
    two = convert(load_recipe(write_recipe(tmp_path / "r2.yaml", target, drafter, tp=2)), tmp_path / "c2",
                  progress=False)
    # tp 2: each rank holds the g_proj rows of the heads whose q rows it holds, the norms whole
    full = load_file(drafter / "model.safetensors")
    D, heads = 16, 2  # head_dim, heads per rank
    for rank in range(2):
        shard = load_file(two / "drafter" / f"rank{rank}.safetensors")
        for i in range(2):
            L = f"transformer.layers.{i}.attention."
            torch.testing.assert_close(shard[L + "gate.weight"],
                                       full[f"layers.{i}.self_attn.g_proj.weight"][rank * heads:(rank + 1) * heads])
            q = full[f"layers.{i}.self_attn.q_proj.weight"]
            torch.testing.assert_close(shard[L + "q.weight"], q[rank * heads * D:(rank + 1) * heads * D])
        for k in range(2):
            torch.testing.assert_close(shard[f"dflash.aux_hidden_norms.{k}.weight"],
                                       full[f"aux_hidden_norms.{k}.weight"])
    for ckpt in (one, two):
        assert step_tokens(checkpoint_steps(ckpt, PROMPTS, 20, mode="dflash", stop_token_ids=[]), 2) == want, ckpt.name


@pytest.mark.parametrize("backend", [b for b, spec in BACKENDS.items() if "laguna" not in spec.drafters])
def test_backends_without_laguna_refuse_it_at_convert(tmp_path, laguna_pair, backend):
    target, drafter = laguna_pair
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", target, drafter, gpu="h100-sxm", fmt="bf16",
                                      backend=backend),
                         check_rules=False)
    with pytest.raises(UserError, match=rf"architectures is \['{LAGUNA_ARCH}'\] and backend.name is {backend}: .*"
                                        r"backend reference runs it"):
        convert(recipe, tmp_path / "c", progress=False)


def test_the_support_table_has_the_laguna_row():
    assert "laguna" in DRAFTERS and "laguna" in BACKENDS["reference"].drafters


def test_a_laguna_checkpoint_without_its_gates_is_refused_by_tensor(tmp_path, laguna_pair):
    target, drafter = laguna_pair
    broken = tmp_path / "d"
    broken.mkdir()
    (broken / "config.json").write_text((drafter / "config.json").read_text())
    weights = load_file(drafter / "model.safetensors")
    weights.pop("layers.1.self_attn.g_proj.weight")
    save_file(weights, broken / "model.safetensors")
    with pytest.raises(UserError, match=r"missing tensor layers.1.self_attn.g_proj.weight \(expected shape \[4, 64\] "
                                        r"\(num_attention_heads, hidden_size\)\)"):
        load_pair(target, broken)
