"""perf/bench_dynamo.py's arithmetic without servers: per level and metric, each server's median
over the repeats and the median of their per-repeat ratios; the report prints them side by side."""

import io

import pytest

from trtllm_dflash.perf.bench_dynamo import METRICS, level_row, metric_row, print_report


def test_a_metric_is_the_median_of_each_server_and_of_the_ratios():
    repeats = [{"ours": 10.0, "dynamo": 9.0}, {"ours": 12.0, "dynamo": 10.8}, {"ours": 8.0, "dynamo": None}]
    assert metric_row(repeats) == {"ours": 10.0, "dynamo": pytest.approx(9.9),
                                   "dynamo_over_ours": pytest.approx(0.9)}  # a repeat without both is no ratio
    assert metric_row([{"ours": None, "dynamo": None}])["dynamo_over_ours"] is None


def test_a_level_has_every_metric_and_the_report_puts_both_servers_and_the_ratio_on_one_row():
    got = {"ours": {"tok_s": 40.0, "ttft_ms": 20.0, "tpot_ms": 25.0},
           "dynamo": {"tok_s": 36.0, "ttft_ms": 30.0, "tpot_ms": 27.5}}
    row = level_row(1, [got])
    assert set(row) == {"concurrency", *METRICS} and row["ttft_ms"]["dynamo_over_ours"] == pytest.approx(1.5)
    out = io.StringIO()
    print_report({"recipe": "cpu-tiny-pystd", "mode": "ddtree", "repeats": 1, "levels": [row]}, file=out)
    text = out.getvalue()
    assert all(x in text for x in ("40.0", "36.0", "0.900", "1.500", "1.100"))
