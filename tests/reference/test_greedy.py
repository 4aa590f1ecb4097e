"""Greedy speculative output is token-for-token the target's greedy output (HF generate).

Random drafters accept almost nothing (zero-acceptance rounds); an oracle drafter that
proposes the target's true greedy future (optionally corrupted at one slot) forces
full-acceptance and partial-acceptance rounds. Each test asserts the kinds of rounds it
is meant to exercise actually happened.
"""

import random

import pytest
import torch

from reference_helpers import hf_model
from trtllm_dflash.reference import generate, load_pair, rounds

_REFS: dict = {}


def hf_greedy(hf, prompt, n, eos=()):
    """HF greedy decoding; stops only on `eos` (a list of ids; empty = never). Memoised
    per model and arguments: several tests compare against the same references."""
    key = (id(hf), tuple(prompt), n, tuple(eos))
    if key not in _REFS:
        hf.generation_config.eos_token_id = list(eos) or None
        ids = torch.tensor([prompt])  # explicit mask: HF would treat prompt tokens equal to pad_token_id as padding
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, pad_token_id=0)
        _REFS[key] = out[0, len(prompt):].tolist()
    return _REFS[key]


def prompts_for(seed, n=3, vocab=255):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(2, 14))] for _ in range(n)]


_MODELS: dict = {}


@pytest.fixture(params=["qwen3_pair", "llama_pair"])
def pair(request):
    """(HF model, our target, our drafter), loaded once per session."""
    if request.param not in _MODELS:
        target_dir, drafter_dir = request.getfixturevalue(request.param)
        _MODELS[request.param] = (hf_model(target_dir), *load_pair(target_dir, drafter_dir))
    return _MODELS[request.param]


@pytest.mark.parametrize("mode,kw", [
    ("ar", {}), ("dflash", {}), pytest.param("dflash", {"block_size": 3}, marks=pytest.mark.slow),
    ("ddtree", {}), pytest.param("ddtree", {"ddtree_budget": 24}, marks=pytest.mark.slow)])
def test_random_drafter_matches_hf(pair, mode, kw, monkeypatch):
    hf, target, drafter = pair
    moves = count_moves(monkeypatch)
    rounds = []
    for seed in range(2):
        for prompt in prompts_for(seed, n=4):
            ref = hf_greedy(hf, prompt, 40)
            (got,) = generate(target, drafter, [prompt], 40, mode=mode, stop_token_ids=[], **kw)
            assert got.tokens == ref, (seed, prompt)
            rounds += got.stats.accepted_per_round
    assert 1 in rounds  # rounds where no draft was accepted (all of them, for ar)
    if mode == "ddtree" and kw:  # a wide tree: some accepted paths left the first-child chain,
        assert moves[0] > 0  # so their K/V were compacted into contiguous cache slots


def count_moves(monkeypatch):
    from trtllm_dflash.reference.cache import KVCache

    calls, real = [0], KVCache.move

    def move(self, *a):
        calls[0] += 1
        return real(self, *a)

    monkeypatch.setattr(KVCache, "move", move)
    return calls


def install_oracle(monkeypatch, futures, corrupt_every=0):
    """Make the drafter propose the target's true greedy continuation. futures[r] is
    request r's prompt + greedy output; every `corrupt_every`-th round one slot (cycling)
    is replaced by a wrong token. The real drafter still runs (its cache stays in use)."""
    real = rounds._draft_logits
    calls = [0]

    def oracle(target, drafter, st, T):
        logits = real(target, drafter, st, T)
        calls[0] += 1
        fake = torch.full_like(logits, -10.0)
        for b, (r, s) in enumerate(zip(st.rows, st.start.tolist())):
            future = futures[r][s + 1 : s + T] + [0] * T
            for j in range(T - 1):
                tok = future[j]
                if corrupt_every and calls[0] % corrupt_every == 0 and j == calls[0] % (T - 1):
                    tok = (tok + 1) % logits.shape[-1]
                fake[b, j, tok] = 10.0
        return fake

    monkeypatch.setattr(rounds, "_draft_logits", oracle)


@pytest.mark.parametrize("mode", ["dflash", "ddtree"])
@pytest.mark.parametrize("corrupt_every", [0, 2])
def test_oracle_drafter_matches_hf(pair, monkeypatch, mode, corrupt_every):
    hf, target, drafter = pair
    prompts = prompts_for(7, n=4)
    refs = [hf_greedy(hf, p, 45) for p in prompts]
    install_oracle(monkeypatch, [p + r for p, r in zip(prompts, refs)], corrupt_every)
    check_full_and_partial(target, drafter, prompts, refs, mode, corrupt_every)


def check_full_and_partial(target, drafter, prompts, refs, mode, partial: bool):
    """Each prompt decodes to its reference; full blocks were accepted (and partial ones)."""
    rounds = []
    for prompt, ref in zip(prompts, refs):
        (got,) = generate(target, drafter, [prompt], len(ref), mode=mode, stop_token_ids=[])
        assert got.tokens == ref
        rounds += got.stats.accepted_per_round
    assert drafter.block_size in rounds  # full blocks: block_size - 1 accepted drafts + bonus
    if partial:
        assert any(1 < a < drafter.block_size for a in rounds)  # partial acceptance


def test_stop_token(pair):
    hf, target, drafter = pair
    prompt = prompts_for(3, n=1)[0]
    ref = hf_greedy(hf, prompt, 30)
    eos = ref[9] if ref[9] not in ref[:9] else ref[5]  # a token the greedy output really produces
    ref_stop = hf_greedy(hf, prompt, 30, eos=[eos])
    assert ref_stop[-1] == eos and len(ref_stop) < 30
    for mode in ("ar", "dflash", "ddtree"):
        (got,) = generate(target, drafter, [prompt], 30, mode=mode, stop_token_ids=[eos])
        assert got.tokens == ref_stop and got.finish_reason == "stop"
    (got,) = generate(target, drafter, [prompt], 30, mode="dflash", stop_token_ids=[])
    assert got.tokens == ref and got.finish_reason == "length"


def test_default_stop_is_the_targets_eos(llama_pair):
    """stop_token_ids=None means the target's eos ids (Llama config: eos_token_id 2), as in HF generate."""
    hf, target, drafter = _MODELS.get("llama_pair") or (hf_model(llama_pair[0]), *load_pair(*llama_pair))
    assert target.cfg.eos_token_ids == (2,)
    stopped = 0
    for prompt in prompts_for(7, n=4):
        ref = hf_greedy(hf, prompt, 45, eos=[2])
        (got,) = generate(target, drafter, [prompt], 45, mode="dflash")
        assert got.tokens == ref
        stopped += got.finish_reason == "stop"
    assert stopped  # eos was really produced at least once


def test_qwen3_moe_target(tmp_path):
    """The loop over a Qwen3-MoE target (router top-k, per-token experts) matches HF too."""
    from reference_helpers import make_drafter, make_target

    t = make_target(tmp_path / "t", "qwen3_moe", seed=2, norm_topk_prob=True)
    hf, (target, drafter) = hf_model(t), load_pair(t, make_drafter(tmp_path / "d", t, seed=2))
    for prompt in prompts_for(5, n=2):
        ref = hf_greedy(hf, prompt, 30)
        for mode in ("dflash", "ddtree"):
            (got,) = generate(target, drafter, [prompt], 30, mode=mode, stop_token_ids=[])
            assert got.tokens == ref, mode


def test_the_rounds_host_side_greedy_verdict_is_greedy_verify():
    """block_round decides greedy rounds on the host from one read of [anchor, drafts, argmax]
    (rounds._greedy_accept): the same accepted counts and bonus tokens as verify.greedy_verify,
    per-row lengths included."""
    import torch

    from trtllm_dflash.reference.rounds import _greedy_accept
    from trtllm_dflash.reference.verify import greedy_verify

    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        B, T = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g))
        logits = torch.randn(B, T, 5, generator=g)
        best = logits.argmax(-1)
        draft = torch.where(torch.rand(B, T - 1, generator=g) < 0.7, best[:, :-1],
                            torch.randint(0, 5, (B, T - 1), generator=g))
        lengths = torch.randint(0, T, (B,), generator=g)
        anchor = torch.randint(0, 5, (B, 1), generator=g)
        acc, new = _greedy_accept(torch.cat([anchor, draft, best], 1).tolist(), T, lengths.tolist())
        accepted, bonus = greedy_verify(draft, logits, lengths)
        assert acc == accepted.tolist() and [n[-1] for n in new] == bonus.tolist()
        assert all(n[:-1] == d[:a] for n, d, a in zip(new, draft.tolist(), acc))
