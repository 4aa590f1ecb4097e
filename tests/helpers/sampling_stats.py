"""The exact joint distribution of the first generated tokens (enumerated with HF's own logits
warpers) and Pearson's chi-square test against it: the sampling-statistics tests of every
decoding path (reference runners, engine runners) share these."""

import torch
from transformers import (
    LogitsProcessorList,
    NoBadWordsLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from reference_helpers import hf_model
from trtllm_dflash.reference import SamplingParams

PROMPT = [1, 5, 2, 3]


def exact_joint(target_dir, s: SamplingParams, n_tok=3, prompt=PROMPT, bad_words=None):
    """{(x1, .., x_n): probability} under HF's warpers, by enumerating the support level by level
    (every token of positive probability after every sequence of positive probability).
    bad_words: token sequences HF's NoBadWordsLogitsProcessor bans first."""
    hf = hf_model(target_dir)
    warp = LogitsProcessorList([NoBadWordsLogitsProcessor(bad_words)] if bad_words else [])
    warp.append(TemperatureLogitsWarper(s.temperature))
    if s.top_k:
        warp.append(TopKLogitsWarper(s.top_k))
    if s.top_p < 1:
        warp.append(TopPLogitsWarper(s.top_p))
    joint = {(): 1.0}
    for _ in range(n_tok):
        seqs = list(joint)
        ids = torch.tensor([list(prompt) + list(seq) for seq in seqs])
        with torch.no_grad():
            P = torch.softmax(warp(ids, hf(ids).logits[:, -1]), -1)  # [#seqs, V]
        joint = {(*seq, t): joint[seq] * float(P[row, t]) for row, seq in enumerate(seqs)
                 for t in P[row].nonzero()[:, 0].tolist()}
    return joint


def chi_square_p(samples, joint):
    """p-value of Pearson's chi-square test; cells with expected count < 5 pooled."""
    n = len(samples)
    counts = {}
    for seq in samples:
        counts[seq] = counts.get(seq, 0) + 1
    assert set(counts) <= set(joint), f"impossible sequences sampled: {set(counts) - set(joint)}"
    big = [c for c in joint if joint[c] * n >= 5]
    obs = [counts.get(c, 0) for c in big] + [n - sum(counts.get(c, 0) for c in big)]
    exp = [joint[c] * n for c in big] + [n * (1 - sum(joint[c] for c in big))]
    if exp[-1] < 5:  # nothing to pool
        obs, exp = obs[:-1], exp[:-1]
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))
