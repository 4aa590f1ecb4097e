"""DFlash2 drafters in the one decode loop are lossless, in batch, with mid-flight joins and cancels.

- greedy: the output is token-for-token HF's greedy output (random DFlash2 drafter; and an
  oracle path that forces full and partial acceptance), and a batch whose requests join and
  leave between rounds (with varying draft lengths) gives each request its solo output;
- sampling: the first three tokens follow the target's exact (filtered) distribution
  (chi-square at alpha 1e-3, as test_sampling.py), also when half the rows join a round
  later and decoy rows are cancelled mid-flight; the same test rejects a loop that verifies
  the selector's path with the wrong q (the plain draft softmax instead of the selector's).
"""

import pytest
import torch
from test_greedy import check_full_and_partial, hf_greedy, prompts_for

from reference_helpers import hf_model, make_dflash2_drafter, make_target
from sampling_stats import PROMPT, chi_square_p, exact_joint
from trtllm_dflash.policy.decision import Drafts
from trtllm_dflash.reference import SamplingParams, generate, load_pair
from trtllm_dflash.reference.draft import Selection
from trtllm_dflash.reference.generate import Decoder
from trtllm_dflash.reference.runners import ReferenceDrafter

ALPHA = 1e-3
N = 12000


@pytest.fixture(scope="module")
def pair2(qwen3_pair, tmp_path_factory):
    target_dir, _ = qwen3_pair
    d = make_dflash2_drafter(tmp_path_factory.mktemp("dflash2") / "d", target_dir, seed=11)
    return hf_model(target_dir), *load_pair(target_dir, d)


@pytest.mark.parametrize("mode,kw", [("dflash", {}), ("dflash", {"block_size": 3}), ("ddtree", {})])
def test_random_dflash2_drafter_matches_hf(pair2, mode, kw):
    hf, target, drafter = pair2
    for prompt in prompts_for(21, n=3):
        (got,) = generate(target, drafter, [prompt], 40, mode=mode, stop_token_ids=[], **kw)
        assert got.tokens == hf_greedy(hf, prompt, 40), prompt


def install_oracle_path(monkeypatch, futures, corrupt_every=0):
    """The drafter runs and selects as usual, then its path is replaced by the target's true
    greedy future (every `corrupt_every`-th round one slot wrong): full and partial acceptance."""
    real = ReferenceDrafter.draft_path
    calls = [0]

    def oracle(self, anchor, start, ctx, ctx_pos, T, sampling, gen):
        path, q = real(self, anchor, start, ctx, ctx_pos, T, sampling, gen)
        calls[0] += 1
        fake = path.clone()
        for b, s in enumerate(start.tolist()):
            row = next(f for f in futures if len(f) > s and f[s] == int(anchor[b]))
            future = (row[s + 1 : s + T] + [0] * T)[: T - 1]
            if corrupt_every and calls[0] % corrupt_every == 0:
                future[calls[0] % (T - 1)] = (future[calls[0] % (T - 1)] + 1) % 256
            fake[b] = torch.tensor(future)
        return fake, q

    monkeypatch.setattr(ReferenceDrafter, "draft_path", oracle)


@pytest.mark.parametrize("corrupt_every", [0, 2])
def test_oracle_path_matches_hf(pair2, monkeypatch, corrupt_every):
    hf, target, drafter = pair2
    prompts = prompts_for(8, n=2)
    refs = [hf_greedy(hf, p, 40) for p in prompts]
    install_oracle_path(monkeypatch, [p + r for p, r in zip(prompts, refs)], corrupt_every)
    check_full_and_partial(target, drafter, prompts, refs, "dflash", corrupt_every)


def test_joins_and_cancels_give_solo_outputs(pair2):
    """Requests join between rounds and one is cancelled mid-flight; draft lengths vary by
    round. Every request gets exactly its solo greedy output (the cancelled one a prefix)."""
    _, target, drafter = pair2
    prompts = prompts_for(5, n=5)
    limits = [30, 12, 25, 30, 18]
    solo = [generate(target, drafter, [p], n, stop_token_ids=[])[0].tokens for p, n in zip(prompts, limits)]
    dec = Decoder(target, drafter, max_len=64)
    got = {i: [] for i in range(5)}

    def take(rec):
        for r, t in zip(rec.seq_ids, rec.tokens):
            got[r] += t

    take(dec.admit([0, 1], prompts[:2], limits[:2], [[], []]))
    for draft_len in (None, 3):
        take(dec.step(Drafts.of(draft_len)))
    take(dec.admit([2, 3], prompts[2:4], limits[2:4], [[], []]))  # join mid-flight
    take(dec.step(Drafts(0)))  # a round without a drafter pass: pending context carries over
    take(dec.step())
    dec.cancel([3])  # leaves mid-flight
    take(dec.admit([4], prompts[4:], limits[4:], [[]]))
    schedule = iter([None, 5, 1, None] * 20)
    while dec.running:
        take(dec.step(Drafts.of(next(schedule))))
    for i in (0, 1, 2, 4):
        assert got[i] == solo[i], i
    assert got[3] == solo[3][: len(got[3])] and 0 < len(got[3]) < limits[3]


@pytest.fixture(scope="module")
def tiny2(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_dflash2")
    t = make_target(root / "t8", "qwen3", seed=4, vocab=8, layers=2, std=0.25)
    d = make_dflash2_drafter(root / "d8", t, seed=9, block_size=4, target_layer_ids=(0, 1), std=0.25, selector_top_k=4)
    return t, d


def sample_first_three(pair, s, joins=False):
    target, drafter = load_pair(*pair)
    if not joins:
        out = generate(target, drafter, [PROMPT] * N, 4, sampling=s, stop_token_ids=[])
        return [tuple(g.tokens[:3]) for g in out], [a for g in out for a in g.stats.accepted_per_round[:1]]
    dec = Decoder(target, drafter, sampling=s, max_len=16)
    got = {}

    def take(rec):
        for r, t in zip(rec.seq_ids, rec.tokens):
            got.setdefault(r, []).extend(t)

    half = N // 2
    take(dec.admit(list(range(half)), [PROMPT] * half, [4] * half, [[]] * half))
    take(dec.step())
    decoys = list(range(N, N + 500))  # other requests that join and are cancelled mid-flight
    take(dec.admit(list(range(half, N)) + decoys, [PROMPT] * (N - half) + [[3, 1]] * 500, [4] * (N - half + 500),
                   [[]] * (N - half + 500)))
    take(dec.step())
    dec.cancel(decoys)
    while dec.running:
        take(dec.step())
    return [tuple(got[i][:3]) for i in range(N)], []


CASES = [
    pytest.param(SamplingParams(temperature=1.0, seed=31), False, id="t1", marks=pytest.mark.slow),
    pytest.param(SamplingParams(temperature=0.7, top_k=2, seed=32), False, id="t07-topk2", marks=pytest.mark.slow),
    pytest.param(SamplingParams(temperature=1.0, seed=33), True, id="t1-joins-cancels"),
]


@pytest.mark.parametrize("s,joins", CASES)
def test_dflash2_sampling_keeps_the_target_distribution(tiny2, s, joins):
    samples, rounds = sample_first_three(tiny2, s, joins)
    if not joins:  # the first round (up to 3 drafts) saw rejections and acceptances
        assert {1, 2} <= set(rounds) and (s.top_k or 3 in rounds), sorted(set(rounds))
    p = chi_square_p(samples, exact_joint(tiny2[0], s))
    assert p > ALPHA, f"chi-square rejects the target distribution: p = {p:.2e}"


@pytest.mark.slow
def test_wrong_q_is_detected(tiny2, monkeypatch):
    """Rejection sampling the selector's path against another q than the one it was drawn
    from (here: uniform over the candidates) is not lossless; the same test must see it."""

    def uniform(self, vocab):
        q = torch.full(self.candidates.shape, 1.0 / self.candidates.shape[-1])
        return torch.zeros(*q.shape[:2], vocab).scatter_(-1, self.candidates, q)

    monkeypatch.setattr(Selection, "q_vocab", uniform)
    s = SamplingParams(temperature=1.0, seed=31)
    samples, _ = sample_first_three(tiny2, s)
    p = chi_square_p(samples, exact_joint(tiny2[0], s))
    assert p < ALPHA, f"the wrong q was not detected: p = {p:.2e}"
