"""Drafter training data: prompt sampling, greedy continuations, loss mask."""

import pytest
import torch

from trtllm_dflash.errors import UserError
from trtllm_dflash.prompts.sources import sample_eval_prompts, sample_train_prompts
from trtllm_dflash.train.data import generated_loss_mask, greedy_continue
from trtllm_dflash.train.target import TargetModelConfig, build_model

TINY = TargetModelConfig(vocab_size=128, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32,
                         intermediate_size=128, max_position_embeddings=64)
EOS = 0


def _stream(n=3000, eos_every=97, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(2, TINY.vocab_size, (n,), generator=g)
    t[eos_every - 1 :: eos_every] = EOS  # "files" of 96 tokens
    return t


def _is_window(tokens, w):
    n = w.numel()
    return bool((tokens.unfold(0, n, 1) == w).all(dim=1).any())


def test_train_prompts_are_eos_free_windows_and_seeded():
    tokens = _stream()
    p = sample_train_prompts(tokens, 50, 24, seed=5, eos_id=EOS)
    assert p.shape == (50, 24) and p.dtype == torch.long
    assert not (p == EOS).any()
    assert all(_is_window(tokens, w) for w in p)
    assert torch.equal(p, sample_train_prompts(tokens, 50, 24, seed=5, eos_id=EOS))
    assert not torch.equal(p, sample_train_prompts(tokens, 50, 24, seed=6, eos_id=EOS))
    with pytest.raises(UserError, match="eos-free"):
        sample_train_prompts(tokens, 5, 120, seed=0, eos_id=EOS)  # longer than any file


def test_eval_prompts_evenly_spaced_without_overlap():
    tokens = _stream()
    p = sample_eval_prompts(tokens, 10, 32, eos_id=EOS)
    assert p.shape == (10, 32) and not (p == EOS).any()
    starts = [int((tokens.unfold(0, 32, 1) == w).all(dim=1).nonzero()[0]) for w in p]
    assert starts == sorted(starts) and all(b - a >= 32 for a, b in zip(starts, starts[1:]))
    assert starts[-1] > tokens.numel() // 2  # spread over the stream, not bunched at the start
    with pytest.raises(UserError, match="room for only"):
        sample_eval_prompts(tokens, 200, 32, eos_id=EOS)


def test_loss_mask_stops_after_first_eos():
    gen = torch.tensor([[5, 6, 7, 8], [5, EOS, 7, EOS], [EOS, 6, 7, 8]])
    m = generated_loss_mask(gen, prompt_len=2, eos_id=EOS)
    assert m.dtype == torch.uint8
    assert m.tolist() == [[0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0], [0, 0, 1, 0, 0, 0]]


def test_continuations_equal_uncached_greedy():
    model = build_model(TINY, seed=0).eval()
    tokens = _stream()
    prompts = sample_train_prompts(tokens, 5, 12, seed=1, eos_id=EOS)
    done = []
    gen = greedy_continue(model, prompts, gen_len=20, batch_size=2, on_batch=done.append)
    assert gen.shape == (5, 20) and gen.dtype == torch.long
    assert done == [2, 2, 1]  # batches of 2 with a remainder
    full = torch.cat([prompts, gen], dim=1)  # [5, 32]
    with torch.no_grad():
        logits = model(input_ids=full[:, :-1], use_cache=False).logits  # [5, 31, V]
    # Teacher-forced argmax at every generated position must reproduce the token: the cached,
    # batched decode is exactly greedy decoding.
    assert torch.equal(logits[:, 11:].argmax(-1), gen)
    # Batching does not change the result.
    assert torch.equal(greedy_continue(model, prompts, gen_len=20, batch_size=5), gen)


def test_generate_data_files(tmp_path):
    from trtllm_dflash.train.data import generate_data, load_continuations

    model = build_model(TINY, seed=0).eval()
    train_tokens, held_tokens = _stream(seed=1), _stream(n=1500, seed=2)
    meta = generate_data(model, train_tokens, held_tokens, tmp_path, eos_token_id=EOS, mask_token_id=1, num_seqs=6,
                         prompt_len=10, gen_len=14, batch_size=4, seed=3, eval_prompts=3, eval_prompt_len=8,
                         eval_gen_len=5)
    assert meta["dtype"] == "float32" and not list(tmp_path.glob("*.tmp"))
    d = load_continuations(tmp_path)
    ids, mask = d["input_ids"], d["loss_mask"]
    assert ids.shape == mask.shape == (6, 24) and ids.dtype == torch.long and mask.dtype == torch.uint8
    assert torch.equal(ids[:, :10], sample_train_prompts(train_tokens, 6, 10, seed=3, eos_id=EOS))
    assert torch.equal(mask, generated_loss_mask(ids[:, 10:], 10, EOS))
    assert d["prompt_ids"].shape == (3, 8) and d["greedy_ids"].shape == (3, 5)
    assert d["meta"]["num_seqs"] == 6 and d["meta"]["mask_token_id"] == 1
    with torch.no_grad():
        tf = model(input_ids=ids[:, :-1]).logits.argmax(-1)  # [6, 23] teacher-forced greedy
        held = torch.cat([d["prompt_ids"], d["greedy_ids"]], dim=1)
        tf_held = model(input_ids=held[:, :-1]).logits.argmax(-1)
    assert torch.equal(tf[:, 9:], ids[:, 10:])
    assert torch.equal(tf_held[:, 7:], d["greedy_ids"])
    with pytest.raises(UserError, match="max_position_embeddings"):
        generate_data(model, train_tokens, held_tokens, tmp_path / "x", eos_token_id=EOS, mask_token_id=1,
                      num_seqs=2, prompt_len=60, gen_len=10)
    (tmp_path / "meta.json").unlink()
    with pytest.raises(UserError, match="no meta.json"):
        load_continuations(tmp_path)
