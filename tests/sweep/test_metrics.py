"""Serving metrics on synthetic timestamps (integer nanoseconds), checked by hand."""

import numpy as np
import pytest

from trtllm_dflash.sweep.metrics import (
    Distribution,
    RequestRecord,
    e2e,
    inter_chunk_latencies,
    pareto_front,
    percentile,
    request_tau,
    summarize_level,
    tokens_per_s_per_user,
    tpot,
    ttft,
)

MS = 1_000_000  # ns


def rec(i=0, start=0, chunks=((100, 1), (150, 4), (170, 5)), end=None, rounds=3, **kw):
    times = [start + t * MS for t, _ in chunks]
    return RequestRecord(
        request_id=i, concurrency=1, start_ns=start, chunk_ns=times, chunk_tokens=[n for _, n in chunks],
        end_ns=end if end is not None else times[-1], rounds=rounds, **kw,
    )


def test_request_metrics_by_hand():
    r = rec()
    # first chunk at 100 ms; 10 tokens; last at 170 ms -> TPOT = (0.170 - 0.100) / 9
    assert ttft(r) == pytest.approx(0.100)
    assert e2e(r) == pytest.approx(0.170)
    assert tpot(r) == pytest.approx(0.070 / 9)
    assert tokens_per_s_per_user(r) == pytest.approx(9 / 0.070)
    assert inter_chunk_latencies(r) == pytest.approx([0.050, 0.020])
    assert request_tau(r) == pytest.approx((10 - 1) / 3)  # the first token comes from the prefill


def test_single_token_has_no_tpot():
    r = rec(chunks=((80, 1),), rounds=1)
    assert tpot(r) is None and tokens_per_s_per_user(r) is None and ttft(r) == pytest.approx(0.080)


def test_percentiles_match_numpy():
    rng = np.random.default_rng(0)
    xs = sorted(rng.exponential(size=101).tolist())
    for q in (0, 50, 90, 99, 100):
        assert percentile(xs, q) == pytest.approx(np.percentile(xs, q))
    d = Distribution.of(xs)
    assert d.n == 101 and d.mean == pytest.approx(np.mean(xs)) and d.p99 == pytest.approx(np.percentile(xs, 99))
    assert Distribution.of([]) is None


def test_level_summary_excludes_warmup_and_counts_failures():
    a = rec(0, start=0, chunks=((100, 1), (200, 9)), rounds=4)  # ends 200 ms
    b = rec(1, start=50 * MS, chunks=((120, 2), (250, 8)), rounds=2)  # ends 300 ms
    warm = rec(2, start=0, chunks=((10, 50),), rounds=1, warmup=True)
    bad = rec(3, start=0, chunks=(), end=5 * MS, rounds=0, error="cancelled")
    s = summarize_level([a, b, warm, bad], concurrency=2, gpus=2)
    assert s.requests == 3 and s.failed == 1
    assert s.wall_s == pytest.approx(0.300)  # first start 0 .. last end 300 ms, warm-up excluded
    assert s.output_tokens == 20
    assert s.output_tok_s == pytest.approx(20 / 0.300)
    assert s.output_tok_s_per_gpu == pytest.approx(20 / 0.300 / 2)
    assert s.tau == pytest.approx((20 - 2) / 6)  # pooled verify-pass tokens / verify passes
    assert s.ttft_s.mean == pytest.approx((0.100 + 0.120) / 2)
    assert s.tpot_s.p50 == pytest.approx((0.100 / 9 + 0.130 / 9) / 2)
    row = s.flat()
    assert row["ttft_s_p90"] == pytest.approx(s.ttft_s.p90) and row["concurrency"] == 2


def test_pareto_front():
    pts = [(10, 100), (20, 90), (15, 80), (30, 30), (5, 120), (30, 20)]
    assert pareto_front(pts) == [0, 1, 3, 4]
    assert pareto_front([(1, 1), (1, 1)]) == [0, 1]  # ties do not dominate


def test_per_request_tau_percentiles_from_known_records():
    """Ten requests of 4 verify passes accepting 0..9 drafts: taus 1.0, 1.25, ..., 3.25; the level
    reports their p10 / p50 / p90 (numpy's linear percentiles) beside the pooled tau."""
    recs = [rec(i, chunks=((100, 1), (200, 4 + a)), rounds=4, accepted=a, acceptance_source="response")
            for i, a in enumerate(range(10))]
    taus = [1 + a / 4 for a in range(10)]
    assert [request_tau(r) for r in recs] == pytest.approx(taus)
    s = summarize_level(recs + [rec(10, rounds=0)], 1, 1)  # a request without verify passes has no tau
    assert s.tau_request.n == 10 and s.acceptance_source == "response"
    assert (s.tau_request.p10, s.tau_request.p50, s.tau_request.p90) == pytest.approx(
        tuple(np.percentile(taus, [10, 50, 90])))
    assert (s.tau_request.p10, s.tau_request.p50, s.tau_request.p90) == pytest.approx((1.225, 2.125, 3.025))
    row = s.flat()
    assert row["tau_request_p50"] == pytest.approx(2.125) and row["acceptance_source"] == "response"
    import json
    from dataclasses import asdict

    from trtllm_dflash.sweep.metrics import LevelSummary
    assert LevelSummary.from_json(json.loads(json.dumps(asdict(s)))) == s  # summary.json round trip
    # the server's own accepted count wins over what the client received (a stop word may cut text)
    assert request_tau(rec(chunks=((100, 1), (150, 2)), rounds=2, accepted=4)) == pytest.approx(3.0)
