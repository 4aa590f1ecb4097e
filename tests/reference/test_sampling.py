"""At temperature > 0 the generated tokens follow the target's (filtered) distribution.

Method: a tiny vocabulary; the exact joint distribution of the first three generated
tokens is enumerated from the HF model with HF's own logits warpers (temperature, top-k,
top-p); N independent samples come from one batched `generate` call (N copies of the
prompt, each row its own random stream); a chi-square goodness-of-fit test (cells with
expected count < 5 pooled) must not reject at alpha = 1e-3. The same test must reject a
deliberately wrong sampler (resampling from p instead of the residual after a rejection).
Everything is seeded, so the outcome is deterministic.
"""

import pytest

from reference_helpers import make_drafter, make_target
from sampling_stats import PROMPT, chi_square_p, exact_joint
from trtllm_dflash.reference import SamplingParams, generate, load_pair, rounds

ALPHA = 1e-3
N = 12000


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_vocab")
    t = make_target(root / "t8", "qwen3", seed=4, vocab=8, layers=2, std=0.25)
    d = make_drafter(root / "d8", t, seed=5, block_size=4, target_layer_ids=(0, 1), std=0.25)
    t16 = make_target(root / "t16", "qwen3", seed=6, vocab=16, layers=2, std=0.25)
    d16 = make_drafter(root / "d16", t16, seed=7, block_size=4, target_layer_ids=(0, 1), std=0.25)
    return {8: (t, d), 16: (t16, d16)}


def run(pair, mode, s, **kw):
    target, drafter = load_pair(*pair)
    out = generate(target, drafter, [PROMPT] * N, 4, mode=mode, sampling=s, stop_token_ids=[], **kw)
    rounds = [a for g in out for a in g.stats.accepted_per_round[:1]]
    return [tuple(g.tokens[:3]) for g in out], rounds


CASES = [
    (8, "dflash", SamplingParams(temperature=1.0, seed=1), {}),
    (8, "dflash", SamplingParams(temperature=0.6, seed=2), {}),
    (16, "dflash", SamplingParams(temperature=1.0, top_k=4, seed=3), {}),
    (16, "dflash", SamplingParams(temperature=1.3, top_p=0.7, seed=4), {}),
    (8, "ddtree", SamplingParams(temperature=1.0, seed=5), {"ddtree_budget": 6}),
    (8, "ar", SamplingParams(temperature=1.0, seed=6), {}),
]
# The default run keeps plain and AR sampling; tempered, top-k, top-p and DDTree's (the longest)
# run with the slow tests.
SLOW_CASES = {1, 2, 3, 4}


@pytest.mark.parametrize("vocab,mode,s,kw", [
    pytest.param(*c, id=f"{c[1]}-{i}", marks=[pytest.mark.slow] if i in SLOW_CASES else [])
    for i, c in enumerate(CASES)])
def test_distribution_matches_target(tiny, vocab, mode, s, kw):
    samples, rounds = run(tiny[vocab], mode, s, **kw)
    if mode != "ar":  # the first round (up to 2 drafts) saw rejections, partial and full acceptance
        assert {1, 2, 3} <= set(rounds), sorted(set(rounds))
    p = chi_square_p(samples, exact_joint(tiny[vocab][0], s))
    assert p > ALPHA, f"chi-square rejects the target distribution: p = {p:.2e}"


def test_wrong_sampler_is_detected(tiny, monkeypatch):
    """Resampling from p (instead of norm(max(p - q, 0))) after a rejection over-weights
    the drafter's proposals; the same test must reject it."""

    def wrong(draft, q, p, gen, lengths=None):  # correct acceptance, wrong distribution after a rejection
        accepted, _ = correct(draft, q, p, gen, lengths)
        return accepted, rounds.sample(p.gather(1, accepted[:, None, None].expand(-1, 1, p.shape[-1]))[:, 0], gen)

    correct = rounds.rejection_verify
    monkeypatch.setattr(rounds, "rejection_verify", wrong)
    s = SamplingParams(temperature=1.0, seed=1)
    samples, _ = run(tiny[8], "dflash", s)
    p = chi_square_p(samples, exact_joint(tiny[8][0], s))
    assert p < ALPHA, f"the wrong sampler was not detected: p = {p:.2e}"
