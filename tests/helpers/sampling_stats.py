"""The exact joint distribution of the first generated tokens (enumerated with HF's own logits
warpers) and Pearson's chi-square test against it: the sampling-statistics tests of every
decoding path (reference runners, engine runners) share these."""

import itertools

import torch
from reference_helpers import hf_model
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from trtllm_dflash.reference import SamplingParams

PROMPT = [1, 5, 2, 3]


def exact_joint(target_dir, s: SamplingParams, n_tok=3):
    """{(x1, x2, x3): probability} under HF's warpers, by enumeration."""
    hf = hf_model(target_dir)
    V = hf.config.vocab_size
    warp = LogitsProcessorList([TemperatureLogitsWarper(s.temperature)])
    if s.top_k:
        warp.append(TopKLogitsWarper(s.top_k))
    if s.top_p < 1:
        warp.append(TopPLogitsWarper(s.top_p))
    prefixes = list(itertools.product(range(V), repeat=n_tok - 1))
    ids = torch.tensor([PROMPT + list(p) for p in prefixes])
    with torch.no_grad():
        logits = hf(ids).logits[:, len(PROMPT) - 1 :]  # [#prefixes, n_tok, V]
    P = torch.stack([torch.softmax(warp(ids[:, : len(PROMPT) + i], logits[:, i]), -1) for i in range(n_tok)], 1)
    joint = {}
    for row, p in enumerate(prefixes):
        for last in range(V):
            seq = (*p, last)
            prob = float(torch.prod(torch.stack([P[row, i, seq[i]] for i in range(n_tok)])))
            if prob > 0:
                joint[seq] = prob
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
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))
