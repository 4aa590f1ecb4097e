"""Target training loop: learning, exact resume, export."""

import json

import pytest
import torch

from trtllm_dflash.errors import UserError
from trtllm_dflash.train.target import (
    TargetModelConfig,
    TrainConfig,
    build_model,
    evaluate,
    export,
    load_target,
    train,
)
from trtllm_dflash.train.tokenizer import train_tokenizer

TINY = TargetModelConfig(vocab_size=300, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32,
                         intermediate_size=128, max_position_embeddings=64)


def _cfg(**kw):
    base = dict(seq_len=32, batch_size=4, steps=8, lr=1e-2, min_lr=1e-3, warmup_steps=2, eval_every=1000,
                eval_windows=4, ckpt_every=1000, log_every=1000, seed=0)
    base.update(kw)
    return TrainConfig(**base)


def _periodic_stream(period=37, repeats=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, TINY.vocab_size, (period,), generator=g).repeat(repeats)


def test_training_reduces_loss_on_repeated_data(tmp_path):
    tokens = _periodic_stream()
    cfg = _cfg(steps=30)
    fixed = tokens[: 4 * (cfg.seq_len + 1)].view(4, cfg.seq_len + 1)  # [4, S+1]
    before = evaluate(build_model(TINY, cfg.seed), fixed, bf16=True)
    res = train(TINY, cfg, tokens, tokens, tmp_path, progress=False, log=False)
    after = evaluate(res.model, fixed, bf16=True)
    assert res.step == 30 and len(res.losses) == 30
    # Fresh init sits near ln(300) = 5.7 nats; a period-37 sequence is memorised quickly.
    assert before > 5.0
    assert after < before - 2.0, (before, after)
    assert res.history[-1]["step"] == 30 and "heldout_loss" in res.history[-1]


@pytest.mark.parametrize("bf16", [True, False])
def test_resume_reproduces_uninterrupted_run(tmp_path, bf16):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(2, TINY.vocab_size, (2000,), generator=g)
    cfg = _cfg(steps=6, bf16=bf16)
    full = train(TINY, cfg, tokens, tokens, tmp_path / "a", progress=False, log=False)
    part = train(TINY, cfg, tokens, tokens, tmp_path / "b", stop_after=3, progress=False, log=False)
    assert part.step == 3 and (tmp_path / "b" / "last.pt").is_file()
    rest = train(TINY, cfg, tokens, tokens, tmp_path / "b", resume=True, progress=False, log=False)
    assert rest.step == 6 and sorted(rest.losses) == [4, 5, 6]
    # Same data, same ops, same thread count: the resumed run is expected to be bitwise
    # identical; 1e-6 leaves room only for benign reassociation, far below any real bug
    # (a lost optimizer state or a re-drawn batch changes the loss by >1e-3).
    for step in (4, 5, 6):
        assert rest.losses[step] == pytest.approx(full.losses[step], abs=1e-6)
    for (name, a), b in zip(full.model.state_dict().items(), rest.model.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name


def test_resume_refuses_changed_config(tmp_path):
    tokens = torch.randint(2, TINY.vocab_size, (2000,), generator=torch.Generator().manual_seed(2))
    train(TINY, _cfg(steps=4), tokens, tokens, tmp_path, stop_after=2, progress=False, log=False)
    with pytest.raises(UserError, match="'lr'"):
        train(TINY, _cfg(steps=4, lr=5e-3), tokens, tokens, tmp_path, resume=True, progress=False, log=False)
    with pytest.raises(UserError, match="no checkpoint"):
        train(TINY, _cfg(steps=4), tokens, tokens, tmp_path / "none", resume=True, progress=False, log=False)


def test_export_bf16_round_trip(tmp_path):
    tok = train_tokenizer(["def f(x):\n    return x\n" * 50, "class A:\n    pass\n" * 50], vocab_size=TINY.vocab_size)
    model = build_model(TINY, seed=3)
    out = tmp_path / "target"
    out.mkdir()
    (out / "stale.txt").write_text("replaced atomically")
    export(model, tok, out)
    assert not (out / "stale.txt").exists() and not (tmp_path / "target.tmp").exists()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["dtype"] == "bfloat16"
    assert cfg["tie_word_embeddings"] is True and cfg["rope_theta"] == TINY.rope_theta
    n_params = sum(p.numel() for p in model.parameters())
    size = (out / "model.safetensors").stat().st_size
    assert 2 * n_params <= size < 2 * n_params + 100_000  # bf16, tied head stored once
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tok.eos_token_id == 0
    loaded = load_target(out, torch.float32)
    x = torch.randint(2, TINY.vocab_size, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        for p in model.parameters():  # round the weights only; RoPE's inv_freq buffer stays fp32 as in a fresh load
            p.copy_(p.to(torch.bfloat16).float())
        want = model(input_ids=x).logits
        got = loaded(input_ids=x).logits
    # Same bf16-rounded weights computed in fp32 on both sides: equal up to fp32 noise.
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
