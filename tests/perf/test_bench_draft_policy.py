"""perf/bench_draft_policy.py on a tiny run: every policy decodes the shipped pair's greedy tokens
(the bench raises otherwise), the per-request policy's length histogram counts every request's
rounds, and the ratios are the medians' ratios."""

import pytest
import torch

from trtllm_dflash.perf import bench_draft_policy
from trtllm_dflash.perf.bench_quant import shipped_pair


@pytest.mark.skipif(shipped_pair() is None, reason="the shipped pair is not installed")
@pytest.mark.slow
def test_every_policy_is_lossless_and_the_ratios_are_the_medians():
    # The worker's own torch threads, and one timed round per shape of the cost fits: what is
    # asserted here holds whatever the fit's precision (the fit itself: tests/policy/test_draft_len.py).
    out = bench_draft_policy.bench(levels=(2,), max_new_tokens=12, prompt_len=16, repeats=1,
                                   threads=torch.get_num_threads(), fit_repeats=1)
    (row,) = out["levels"]
    m = row["tok_s_user"]
    assert set(m) == {"ar", "1", "3", "7", "15", "auto-batch", "auto"}
    assert row["auto_over_ar"] == pytest.approx(m["auto"] / m["ar"])
    assert row["auto_over_best"] == pytest.approx(m["auto"] / max(m["ar"], m[str(row["best_fixed"])]))
    rounds = sum(row["auto_lengths"].values())
    assert rounds >= 2 * 11 / 16 and 0 <= row["auto_zero_share"] <= 1  # two requests, 11 tokens after the first each
    assert out["cost_packed"]["packed"] and not out["cost_uniform"]["packed"]
