"""serve/metrics.py: what the engine's rounds become on /metrics, read back as the sweep reads it.

The served checks (a real tritonserver, the OpenAI server) are in test_server.py and
test_openai.py, inside their module fixtures.
"""

import pytest

pytest.importorskip("prometheus_client", reason="needs prometheus_client (the serve extra)")

from trtllm_dflash.serve.metrics import (  # noqa: E402
    COUNTER,
    HISTOGRAM,
    METRICS,
    PrometheusInstruments,
    SpecMetrics,
)
from trtllm_dflash.sweep.server_metrics import parse, totals  # noqa: E402


def _exported(ins: PrometheusInstruments):
    return parse(ins.exposition()[0].decode())


def test_rounds_become_counters_and_per_position_acceptance():
    ins = PrometheusInstruments()
    m = SpecMetrics(ins, "dflash")
    # Round 1: three requests drafted 3, 3, 2 and committed 4 (all accepted + bonus), 1, 2.
    m.round("dflash", [3, 3, 2], [4, 1, 2], 0.01, 0.02)
    # Round 2: one request drafted 3, committed 3 (2 accepted); an AR round of two requests.
    m.round("dflash", [3], [3], 0.01, 0.02)
    m.round("ar", [0, 0], [1, 1], 0.0, 0.01)
    s = _exported(ins)
    t = totals(s, "dflash", "dflash")
    assert (t.drafted, t.accepted, t.rounds) == (11, 3 + 0 + 1 + 2, 4)
    assert t.drafted_per_pos == {1: 4, 2: 4, 3: 3}
    assert t.accepted_per_pos == {1: 3, 2: 2, 3: 1}
    assert t.tau == pytest.approx(1 + 6 / 4)
    assert t.rounds_by_draft_len == {3: 3, 2: 1}  # per request and round: the length that request ran
    ar = totals(s, "dflash", "ar")
    assert (ar.drafted, ar.accepted, ar.rounds, ar.tau) == (0, 0, 2, 1.0)
    assert ar.rounds_by_draft_len == {0: 2}
    assert totals(s, "other").rounds == 0
    # Histograms: one observation per verify pass, the batch size and the largest draft.
    batch = {lab["le"]: v for lab, v in s["dflash_verify_batch_size_bucket"] if lab["mode"] == "dflash"}
    assert batch["1.0"] == 1 and batch["4.0"] == 2
    draft_len = [v for lab, v in s["dflash_spec_decode_draft_len_sum"] if lab["mode"] == "dflash"]
    assert draft_len == [6.0]
    assert [v for lab, v in s["dflash_draft_time_seconds_count"] if lab["mode"] == "ar"] == []  # AR drafts nothing


def test_every_defined_metric_is_exported_under_its_one_name():
    ins = PrometheusInstruments()
    SpecMetrics(ins, "m").round("dflash", [2], [2], 0.001, 0.002)
    s = _exported(ins)
    for metric in METRICS:
        name = metric.name if metric.kind == COUNTER else metric.name + "_count"
        assert metric.kind in (COUNTER, HISTOGRAM)
        assert name in s, name
        assert all(lab["model"] == "m" and lab["mode"] == "dflash" for lab, _ in s[name])


def test_the_grafana_dashboard_queries_only_metrics_we_export():
    """docs/grafana-dflash.json loads, and every metric and label its queries name is one that
    serve/metrics.py defines (histograms through their _bucket / _sum / _count series); every
    defined metric has a panel."""
    import json
    import re
    from pathlib import Path

    dash = json.loads((Path(__file__).resolve().parents[2] / "docs" / "grafana-dflash.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    series = {}
    for m in METRICS:
        for suffix in ([""] if m.kind == COUNTER else ["_bucket", "_sum", "_count"]):
            series[m.name + suffix] = m
    used = set()
    for e in exprs:
        assert e.count("(") == e.count(")"), e
        for name in re.findall(r"\bdflash_[a-z_]+", e):
            assert name in series, f"{name} in {e!r} is not an exported series"
            used.add(series[name].name)
        labels = {lab for group in re.findall(r"by \(([^)]*)\)", e) for lab in group.replace(" ", "").split(",")}
        labels |= set(re.findall(r"(\w+)=~", e)) | set(re.findall(r"label_values\(\w+, (\w+)\)", e))
        allowed = {lab for m in METRICS for lab in m.labels} | {"le"}
        assert labels <= allowed, f"{e!r} names labels {labels - allowed} that no metric has"
    assert used == {m.name for m in METRICS}
