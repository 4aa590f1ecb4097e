"""Bad words inside verification (reference/token_rules.py): greedy output equals the target's
masked greedy decoding (HF generate with bad_words_ids, i.e. NoBadWordsLogitsProcessor), sampled
output follows the target's masked distribution (chi-square against HF's masked, warped joint),
and the committed tokens' log-probabilities are the target's.

Bad words are taken from the unmasked greedy output, so masking changes it; drafters that propose
the unmasked future (banned tokens inside the block) and the masked future (a bad word's prefix
drafted at slot j, its last token banned at slot j + 1) exercise the mask inside the draft block.
"""

import importlib

import pytest
import torch

from reference_helpers import hf_model, make_drafter, make_target
from sampling_stats import PROMPT, chi_square_p, exact_joint
from trtllm_dflash.errors import UserError
from trtllm_dflash.reference import SamplingParams, generate, load_pair, rounds
from trtllm_dflash.reference.token_rules import bans

loop = importlib.import_module("trtllm_dflash.reference.generate")
PROMPTS = [[11, 40, 7, 200, 3], [90, 1, 1, 54], [5, 17, 230, 64, 12, 9, 33]]
N_OUT = 30


def test_bans_look_at_the_drafts_before_each_slot():
    bad = [[5, 7, 9], [3], [2, 4]]
    got = bans([1, 2], [[], [5], [5, 7]], bad)
    assert sorted(got) == [(0, 3), (0, 4), (1, 3), (2, 3), (2, 9)]
    assert bans([], [[]], [[2, 4]]) == []  # the prefix is not there at all


def hf_greedy(hf, prompt, n, bad=None):
    hf.generation_config.eos_token_id = None
    ids = torch.tensor([prompt])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, pad_token_id=0,
                      **({"bad_words_ids": bad} if bad else {}))
    return out[0, len(prompt):].tolist()


def masked_greedy(hf, prompt, ref):
    """(bad words, the masked greedy output): an across-the-prompt word, a one-token word, then a
    two- and a three-token word each taken from the output masked by the words before it, so
    that the final output holds each word's prefix and then not its last token."""
    bad = [[prompt[-1], ref[0], ref[1]], [ref[4]]]
    out = hf_greedy(hf, prompt, N_OUT, bad)
    for at, k in ((10, 2), (17, 3)):
        bad.append(out[at : at + k])
        masked = hf_greedy(hf, prompt, N_OUT, bad)
        assert masked[: at + k - 1] == out[: at + k - 1] and masked != out  # the prefix stays, the word does not
        out = masked
    return bad, out


@pytest.fixture(scope="module")
def refs(qwen3_pair):
    hf = hf_model(qwen3_pair[0])
    out = []
    for p in PROMPTS:
        ref = hf_greedy(hf, p, N_OUT)
        bad, masked = masked_greedy(hf, p, ref)
        out.append((p, bad, masked, ref))
    return out


def install_oracle(monkeypatch, futures):
    """The drafter proposes futures[r][position + 1 ...] (the real drafter still runs)."""
    real = rounds._draft_logits

    def oracle(target, drafter, st, T):
        logits = real(target, drafter, st, T)
        fake = torch.full_like(logits, -10.0)
        for b, (r, s) in enumerate(zip(st.rows, st.start.tolist())):
            future = futures[r][s + 1 : s + T] + [0] * T
            for j in range(T - 1):
                fake[b, j, future[j]] = 10.0
        return fake

    monkeypatch.setattr(rounds, "_draft_logits", oracle)


@pytest.mark.parametrize("mode", ["ar", "dflash", "ddtree"])
@pytest.mark.parametrize("drafts", ["random", "unmasked", "masked"])
def test_greedy_with_bad_words_is_the_targets_masked_greedy(qwen3_pair, refs, monkeypatch, mode, drafts):
    if mode == "ar" and drafts != "random":
        pytest.skip("ar drafts nothing")
    target, drafter = load_pair(*qwen3_pair)
    if drafts != "random":
        install_oracle(monkeypatch, [p + (m if drafts == "masked" else r) for p, _, m, r in refs])
    rounds = []
    for i, (p, bad, masked, _) in enumerate(refs):
        got = list(loop.generate_steps(target, drafter, [p], N_OUT, mode=mode, stop_token_ids=[], bad_words=bad))
        tokens = [t for rec in got for t in rec.tokens[0]]
        assert tokens == masked, (i, drafts)
        rounds += [len(rec.tokens[0]) for rec in got[1:]]
    if drafts == "masked":  # full blocks were accepted around the masks
        assert drafter.block_size in rounds, rounds


def test_batched_requests_keep_their_own_bad_words(qwen3_pair, refs):
    target, drafter = load_pair(*qwen3_pair)
    decoder = loop.Decoder(target, drafter, "dflash", max_len=64)
    rec = decoder.admit([0, 1, 2], [p for p, *_ in refs], [N_OUT] * 3, [[]] * 3,
                        [refs[0][1], None, refs[2][1]])
    out = {r: list(t) for r, t in zip(rec.seq_ids, rec.tokens)}
    while decoder.running:
        rec = decoder.step()
        for r, t in zip(rec.seq_ids, rec.tokens):
            out[r] += t
    assert out[0] == refs[0][2] and out[1] == refs[1][3] and out[2] == refs[2][2]


def test_a_bad_word_outside_the_vocabulary_is_refused(qwen3_pair):
    target, drafter = load_pair(*qwen3_pair)
    with pytest.raises(UserError, match="bad word \\[3, 999\\]: token id 999"):
        generate(target, drafter, [PROMPTS[0]], 4, bad_words=[[3, 999]])


def test_logprobs_are_the_targets(qwen3_pair, refs):
    """Greedy: log_softmax of HF's logits at each generated token, masked where bad words ban."""
    hf = hf_model(qwen3_pair[0])
    target, drafter = load_pair(*qwen3_pair)
    p, bad, masked, _ = refs[0]
    (got,) = generate(target, drafter, [p], N_OUT, stop_token_ids=[], bad_words=bad, logprobs=True)
    assert got.tokens == masked
    with torch.no_grad():
        logits = hf(torch.tensor([p + masked])).logits[0, len(p) - 1 : -1]  # [N_OUT, V]: the logits before each token
    from transformers import NoBadWordsLogitsProcessor

    ban = NoBadWordsLogitsProcessor(bad)
    seq = torch.tensor([p + masked])
    want = [torch.log_softmax(ban(seq[:, : len(p) + i], logits[i : i + 1]), -1)[0, t].item()
            for i, t in enumerate(masked)]
    assert got.logprobs == pytest.approx(want, abs=1e-4)


ALPHA, N = 1e-3, 12000
BAD = [[3], [2, 5], [6, 6]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_bad")
    t = make_target(root / "t8", "qwen3", seed=4, vocab=8, layers=2, std=0.25)
    return t, make_drafter(root / "d8", t, seed=5, block_size=4, target_layer_ids=(0, 1), std=0.25)


@pytest.mark.parametrize("mode,s,kw", [
    ("dflash", SamplingParams(temperature=1.0, seed=11), {}),
    pytest.param("dflash", SamplingParams(temperature=0.8, top_k=5, seed=12), {}, marks=pytest.mark.slow),
    # DDTree's sampling keeps its distribution in tests/reference/test_sampling.py too (slow there)
    pytest.param("ddtree", SamplingParams(temperature=1.0, seed=13), {"ddtree_budget": 6}, marks=pytest.mark.slow),
])
def test_sampling_with_bad_words_follows_the_masked_distribution(tiny, mode, s, kw):
    target, drafter = load_pair(*tiny)
    out = generate(target, drafter, [PROMPT] * N, 4, mode=mode, sampling=s, stop_token_ids=[], bad_words=BAD, **kw)
    samples = [tuple(g.tokens[:3]) for g in out]
    assert not any(_contains(list(x), w) for x in samples for w in BAD)
    p = chi_square_p(samples, exact_joint(tiny[0], s, bad_words=BAD))
    assert p > ALPHA, f"chi-square rejects the target's masked distribution: p = {p:.2e}"


def _contains(seq, word) -> bool:
    return any(seq[i : i + len(word)] == word for i in range(len(seq) - len(word) + 1))


def test_masking_only_after_the_committed_tokens_leaks_bad_words(tiny, monkeypatch):
    """The same run with each slot masked as if it followed the committed tokens only (the drafts
    before it ignored) emits bad words: the test above would see it."""
    real = loop.TokenRules.mask
    monkeypatch.setattr(loop.TokenRules, "mask", lambda self, rows, suffixes, logits: real(
        self, rows, lambda b: [[] for _ in suffixes(b)], logits))
    target, drafter = load_pair(*tiny)
    out = generate(target, drafter, [PROMPT] * 2000, 4, sampling=SamplingParams(temperature=1.0, seed=11),
                   stop_token_ids=[], bad_words=BAD)
    assert any(_contains(g.tokens, w) for g in out for w in BAD[1:])
