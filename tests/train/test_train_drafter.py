"""Drafter training: the training forward equals the inference forward; the loss learns."""

import dataclasses

import pytest
import torch

from trtllm_dflash.errors import UserError
from trtllm_dflash.reference import DFlashDraft, Target, TargetConfig
from trtllm_dflash.reference.rope import RopeConfig
from trtllm_dflash.train.drafter_config import DrafterShape
from trtllm_dflash.train.drafter_init import draft_config, new_drafter
from trtllm_dflash.train.drafter_loss import block_loss, draft_blocks, freeze, sample_anchors, target_features

V, MASK = 128, 1


def tiny_target(seed=0, layers=4) -> Target:
    cfg = TargetConfig(
        arch="qwen3", vocab_size=V, hidden_size=64, intermediate_size=128, num_layers=layers, num_heads=4,
        num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope=RopeConfig(10000.0), max_position_embeddings=512,
        tie_word_embeddings=True, attention_bias=False, mlp_bias=False, qk_norm=True, eos_token_ids=(0,),
    )
    torch.manual_seed(seed)
    t = Target(cfg)
    with torch.no_grad():
        for name, p in t.named_parameters():
            p.normal_(0, 0.1) if not name.endswith("norm.weight") else p.uniform_(0.5, 1.5)
    return t.eval()


def perturbed_drafter(t, seed=1, **kw) -> DFlashDraft:
    """A drafter with non-trivial weights everywhere (norms too), so every term matters."""
    d = new_drafter(t, DrafterShape(**{"num_layers": 2, "block_size": 8, "init": "random", **kw}), MASK, seed)
    with torch.no_grad():
        for name, p in d.named_parameters():
            p.uniform_(0.5, 1.5) if name.endswith("norm.weight") else p.normal_(0, 0.1)
            if name.endswith("base_kernel"):  # DFlash2 convolutions near the identity, as trained ones are
                p[:, 0] += 1
            if name.endswith("kernel_projection.weight"):  # dynamic taps ~ +-0.15 around the base kernel
                p.mul_(0.2)
    return d.eval()


def inference_block(d: DFlashDraft, t: Target, feats, ids, a: int) -> torch.Tensor:
    """DFlashDraft.forward with its KV cache, fed the context features of positions < a,
    in two chunks (as the decode loop feeds them), for the block anchored at a."""
    B = d.block_size
    cache = d.new_cache(1, ids.shape[1] + B)
    noise = t.embed_tokens(torch.tensor([[int(ids[0, a])] + [MASK] * (B - 1)]))
    cut = a // 2
    pos = torch.arange(a)[None]
    if cut:  # (the reference drafter needs at least one new context position per call)
        d(noise, torch.tensor([cut]), feats[:, :cut], pos[:, :cut], cache)  # an earlier round
    return d(noise, torch.tensor([a]), feats[:, cut:a], pos[:, cut:a], cache)[0]  # [B, H]


SLIDING_CAUSAL = {"layer_types": ("sliding_attention",) * 2, "sliding_window": 5, "causal": (True, True)}  # window < B
DFLASH2 = dict(variant="dflash2", conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=8)


@pytest.mark.parametrize("layer_kw,shape_kw", [({}, {}), ({"causal": (True, True)}, {}), (SLIDING_CAUSAL, {}),
                                               ({}, DFLASH2),
                                               ({"input_embedding_scale": 1.5}, {**DFLASH2, "conv_kernel_size": 3})])
def test_training_forward_equals_inference_forward(layer_kw, shape_kw):
    torch.manual_seed(0)
    t = tiny_target()
    d = perturbed_drafter(t, **shape_kw)
    if layer_kw:  # causal in-block attention (a config option of later drafters)
        d.cfg = d.cfg.__class__(**{**d.cfg.__dict__, **layer_kw})
    assert_training_forward_is_inference_forward(t, d)


def test_training_forward_equals_inference_forward_laguna():
    """A Laguna drafter (feature norms, normed context, head gates), sliding and causal as published."""
    torch.manual_seed(0)
    t = tiny_target()
    cfg = dataclasses.replace(perturbed_drafter(t).cfg, laguna=True, gate=True, **SLIDING_CAUSAL)
    d = DFlashDraft(cfg)
    with torch.no_grad():
        for name, p in d.named_parameters():
            p.uniform_(0.5, 1.5) if "norm" in name else p.normal_(0, 0.1)
    assert_training_forward_is_inference_forward(t, d.eval())


def assert_training_forward_is_inference_forward(t, d):
    S = 40
    ids = torch.randint(2, V, (2, S))
    feats = target_features(t, ids, d.target_layer_ids)
    anchors = torch.tensor([[3, 10, 17, 32], [1, 5, 6, 31]])  # overlapping blocks; a=1: one context position
    valid = torch.tensor([[True, True, True, True], [True, True, True, False]])
    with torch.no_grad():
        out = draft_blocks(d, t.embed_tokens, feats, ids, anchors, valid)  # [N, K, B, H]
        for n in range(2):
            for k in range(4):
                if not valid[n, k]:
                    continue
                ref = inference_block(d, t, feats[n : n + 1], ids[n : n + 1], int(anchors[n, k]))
                # fp32, same ops in a different batching/order: ~1e-6 relative; 1e-5 leaves margin.
                torch.testing.assert_close(out[n, k], ref, rtol=1e-5, atol=1e-5)


def test_context_at_and_after_the_anchor_is_invisible():
    """Changing the features of positions >= a, or another block's tokens, cannot change a block."""
    t = tiny_target()
    d = perturbed_drafter(t)
    ids = torch.randint(2, V, (1, 30))
    feats = target_features(t, ids, d.target_layer_ids)
    anchors, valid = torch.tensor([[8, 12]]), torch.ones(1, 2, dtype=torch.bool)
    with torch.no_grad():
        base = draft_blocks(d, t.embed_tokens, feats, ids, anchors, valid)
        f2 = feats.clone()
        f2[:, 8:] += 1.0
        ids2 = ids.clone()
        ids2[0, 12] = (ids[0, 12] + 1) % V  # the second block's anchor
        moved = draft_blocks(d, t.embed_tokens, f2, ids2, anchors, valid)
    torch.testing.assert_close(moved[0, 0], base[0, 0], rtol=0, atol=0)
    assert not torch.allclose(moved[0, 1], base[0, 1])  # the second block does see features 8..11


def test_anchors_are_distinct_sorted_and_inside_the_loss_mask():
    g = torch.Generator().manual_seed(0)
    mask = torch.zeros(3, 50, dtype=torch.uint8)
    mask[0, 10:] = 1
    mask[1, 20:25] = 1  # 5 candidates for 8 anchors
    a, valid = sample_anchors(mask, 8, 4, g)
    assert a.shape == (3, 8)
    for n in range(3):
        got = a[n][valid[n]].tolist()
        assert got == sorted(set(got))
        assert all(mask[n, x] == 1 and x <= 50 - 4 for x in got)
    assert valid[0].all() and valid[1].sum() == 5 and not valid[2].any()
    assert sorted(a[1][valid[1]].tolist()) == [20, 21, 22, 23, 24]


def test_loss_weights_follow_the_slot_decay():
    """With one valid slot per block the loss is exactly that slot's CE; with all slots it is
    the exp(-(k-1)/gamma)-weighted mean."""
    t = tiny_target()
    d = perturbed_drafter(t, block_size=4)
    ids = torch.randint(2, V, (1, 20))
    feats = target_features(t, ids, d.target_layer_ids)
    anchors, valid = torch.tensor([[5]]), torch.ones(1, 1, dtype=torch.bool)
    with torch.no_grad():
        out = draft_blocks(d, t.embed_tokens, feats, ids, anchors, valid)
        ce = torch.nn.functional.cross_entropy(t.lm_head(out[0, 0, 1:]), ids[0, 6:9], reduction="none")
        full = block_loss(d, t, feats, ids, torch.ones(1, 20), anchors, valid, gamma=2.0)
        w = torch.exp(-torch.arange(3.0) / 2.0)
        torch.testing.assert_close(full.loss, (w * ce).sum() / w.sum())
        only_second = torch.zeros(1, 20)
        only_second[0, 7] = 1
        part = block_loss(d, t, feats, ids, only_second, anchors, valid, gamma=2.0)
        torch.testing.assert_close(part.loss, ce[1])
    assert full.slot_count.tolist() == [1, 1, 1] and part.slot_count.tolist() == [0, 1, 0]


def _fit_repeated_batch(t, d, steps=40):
    """`steps` AdamW steps of block_loss on one fixed batch -> (losses, ids, feats, anchors, valid)."""
    d.train()
    ids = torch.randint(2, V, (2, 24))
    feats = target_features(t, ids, d.target_layer_ids)
    lm = torch.ones(2, 24)
    anchors, valid = sample_anchors(lm, 8, 4, torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(d.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        res = block_loss(d, t, feats, ids, lm, anchors, valid, gamma=4.0)
        opt.zero_grad()
        res.loss.backward()
        opt.step()
        losses.append(res.loss.item())
    return losses, ids, feats, anchors, valid


def test_loss_decreases_on_a_repeated_batch():
    torch.manual_seed(0)
    t = freeze(tiny_target())
    d = new_drafter(t, DrafterShape(num_layers=1, block_size=4, init="random"), MASK, seed=0)
    losses, *_ = _fit_repeated_batch(t, d)
    assert losses[-1] < 0.5 * losses[0], losses[::8]
    assert all(p.grad is None for p in t.parameters())  # the target is never trained


def test_dflash2_selector_learns_and_its_choice_is_the_inference_path():
    """The DFlash2 loss (draft CE + teacher-forced selector CE) falls on a repeated batch; the
    selector's training-time picks on an all-correct prefix are the inference selector's path."""
    torch.manual_seed(0)
    t = freeze(tiny_target())
    d = new_drafter(t, DrafterShape(num_layers=1, block_size=4, init="random", **DFLASH2), MASK, seed=0)
    with torch.no_grad():  # a bigram term that matters from the start
        d.candidate_selector.predecessor_codebook.normal_(0, 1.0)
        d.candidate_selector.successor_codebook.normal_(0, 1.0)
        d.candidate_selector.hidden_projection.weight.normal_(0, 0.3)
    losses, ids, feats, anchors, valid = _fit_repeated_batch(t, d)
    # the selector's term moves as labels enter and leave the top-k candidates: compare means
    assert sum(losses[-5:]) / 5 < 0.5 * losses[0], losses[::8]
    assert d.candidate_selector.predecessor_codebook.grad is not None
    # teacher-forced picks == inference path when the predecessors are the picks themselves
    d.eval()
    with torch.no_grad():
        out = draft_blocks(d, t.embed_tokens, feats, ids, anchors, valid)[:, :, 1:]  # [N, K, B-1, H]
        logits = d.logits(out, t.lm_head).float()
        sel = d.candidate_selector
        N, K = anchors.shape
        path = sel.select(out.flatten(0, 1), logits.flatten(0, 1), ids.gather(1, anchors).flatten()).path
        from trtllm_dflash.train.drafter_loss import selector_loss

        prev = torch.cat([ids.gather(1, anchors).flatten()[:, None], path[:, :-1]], dim=1)
        _, picks = selector_loss(sel, out.flatten(0, 1), logits.flatten(0, 1), prev, path, torch.ones(N * K, 3))
    assert torch.equal(picks, path)


def test_target_init_copies_the_last_layers_and_selects_the_deepest_feature():
    t = tiny_target()
    d = new_drafter(t, DrafterShape(num_layers=2, block_size=4, target_layer_ids=(0, 1), init="target"), MASK)
    for i in range(2):
        for k, v in d.layers[i].state_dict().items():
            torch.testing.assert_close(v, t.layers[2 + i].state_dict()[k], rtol=0, atol=0)
    feats = torch.randn(1, 3, 2 * 64)
    torch.testing.assert_close(d.fc(feats), feats[..., 64:], rtol=0, atol=0)
    torch.testing.assert_close(d.hidden_norm.weight, t.layers[2].input_layernorm.weight, rtol=0, atol=0)


def test_bad_shapes_are_user_errors():
    t = tiny_target()
    with pytest.raises(UserError, match="outside the target's layers"):
        draft_config(t.cfg, DrafterShape(target_layer_ids=(0, 4)), MASK)
    with pytest.raises(UserError, match="block size"):
        draft_config(t.cfg, DrafterShape(block_size=1), MASK)
    with pytest.raises(UserError, match="mask_token_id"):
        draft_config(t.cfg, DrafterShape(), V)
    with pytest.raises(UserError, match="conv_group_size 24 does not divide the hidden size 64"):
        draft_config(t.cfg, DrafterShape(variant="dflash2", conv_group_size=24), MASK)
    with pytest.raises(UserError, match="variant 'dflash3' is not one of dflash, dflash2"):
        draft_config(t.cfg, DrafterShape(variant="dflash3"), MASK)


# ----------------------------------------------------------------------------- the command


def make_run(root):
    """A tiny HF Qwen3 target and a drafter-data directory in the train/data.py format."""
    import json

    from safetensors.torch import save_file

    from trtllm_dflash.train.data import FORMAT_VERSION, generated_loss_mask, greedy_continue
    from trtllm_dflash.train.target import TargetModelConfig, build_model

    cfg = TargetModelConfig(vocab_size=V, hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16,
                            intermediate_size=128, max_position_embeddings=256)
    model = build_model(cfg, seed=0).eval()
    with torch.no_grad():  # peaked logits: clear greedy margins, varied text
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0, 0.1)
    model.save_pretrained(root / "target")
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, V, (6, 8), generator=g)
    gen = greedy_continue(model, prompts, 24)
    eval_prompts = torch.randint(2, V, (3, 8), generator=g)
    data = root / "data"
    data.mkdir()
    save_file({"input_ids": torch.cat([prompts, gen], 1), "loss_mask": generated_loss_mask(gen, 8, 0)},
              data / "continuations.safetensors")
    save_file({"prompt_ids": eval_prompts, "greedy_ids": greedy_continue(model, eval_prompts, 12)},
              data / "heldout_prompts.safetensors")
    (data / "meta.json").write_text(json.dumps({"format_version": FORMAT_VERSION, "mask_token_id": MASK,
                                                "num_seqs": 6}))
    return root / "target", data


def _train(target, data, out, *extra):
    from trtllm_dflash.cli import main

    return main(["train-drafter", "--target", str(target), "--data", str(data), "--out", str(out), "--layers", "2",
                 "--block-size", "4", "--anchors", "4", "--seqs-per-step", "2", "--schedule", "constant",
                 "--warmup-steps", "1", "--eval-prompts", "2", "--eval-new-tokens", "12", "--ckpt-every", "1",
                 "--no-progress", "--threads", "1", "--dtype", "float32", *extra])


def test_train_drafter_command_writes_a_zlab_drafter_and_resumes_exactly(tmp_path, capsys):
    import json

    from safetensors.torch import load_file

    from trtllm_dflash.reference import generate, load_pair

    target, data = make_run(tmp_path)
    assert _train(target, data, tmp_path / "a", "--steps", "4", "--eval-every", "2") == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 4 and summary["tau"] >= 1.0
    t, d = load_pair(target, tmp_path / "a")  # z-lab layout, checked against the target
    assert d.cfg.block_size == 4 and d.cfg.num_layers == 2 and d.cfg.mask_token_id == MASK
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["dflash_config"]["target_layer_ids"] == list(d.target_layer_ids) and cfg["num_target_layers"] == 4
    hist = json.loads((tmp_path / "a" / "training.json").read_text())["history"]
    assert [h["step"] for h in hist if "eval_tau" in h] == [2, 4]
    # the trained drafter decodes losslessly
    prompts = [[5, 6, 7, 8]]
    assert generate(t, d, prompts, 10, mode="dflash")[0].tokens == generate(t, None, prompts, 10, mode="ar")[0].tokens

    # 2 steps, stop, resume to 4: the same weights as the uninterrupted run (same batches, anchors, optimizer state)
    assert _train(target, data, tmp_path / "b", "--steps", "2", "--eval-every", "0") == 0
    assert _train(target, data, tmp_path / "b", "--steps", "4", "--eval-every", "0", "--resume") == 0
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0)


def test_train_drafter_command_dflash2(tmp_path, capsys):
    """--variant dflash2 writes z-lab's DFlash2 layout; the drafter decodes losslessly."""
    import json

    from trtllm_dflash.reference import generate, load_pair

    target, data = make_run(tmp_path)
    assert _train(target, data, tmp_path / "d2", "--steps", "2", "--eval-every", "0", "--variant", "dflash2",
                  "--conv-group-size", "8", "--selector-rank", "4", "--selector-top-k", "5") == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["tau"] >= 1.0
    cfg = json.loads((tmp_path / "d2" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"]
    assert {k: cfg["dflash_config"][k] for k in ("conv_kernel_size", "conv_group_size", "selector_rank",
                                                 "selector_top_k")} == {"conv_kernel_size": 2, "conv_group_size": 8,
                                                                        "selector_rank": 4, "selector_top_k": 5}
    t, d = load_pair(target, tmp_path / "d2")
    prompts = [[5, 6, 7, 8]]
    assert generate(t, d, prompts, 10)[0].tokens == generate(t, None, prompts, 10, mode="ar")[0].tokens


def test_train_drafter_command_refuses_bad_input(tmp_path, capsys):

    target, data = make_run(tmp_path)
    assert _train(target, tmp_path / "nodata", tmp_path / "o", "--steps", "1") == 2
    assert "has no continuations.safetensors" in capsys.readouterr().err
    assert _train(target, data, tmp_path / "o", "--steps", "1", "--target-layer-ids", "1,9") == 2
    assert "outside the target's layers" in capsys.readouterr().err
    assert _train(target, data, tmp_path / "o", "--steps", "1", "--resume") == 2
    assert "no checkpoint" in capsys.readouterr().err
    for option, value, expected in (("--lr", "-1", "--lr: -1.0 (expected > 0)"),
                                    ("--selector-weight", "-1", "--selector-weight: -1.0 (expected >= 0)"),
                                    ("--decay-fraction", "1.5", "--decay-fraction: 1.5 (expected in [0, 1])"),
                                    ("--gamma", "nan", "--gamma: nan (expected > 0)")):
        assert _train(target, data, tmp_path / "o", "--steps", "1", option, value) == 2
        err = capsys.readouterr().err
        assert expected in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()
