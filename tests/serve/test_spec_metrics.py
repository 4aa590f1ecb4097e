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
    m.flush()  # counters are summed between flushes (SpecMetrics.flush_s, and when the engine goes idle)
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


def test_ddtree_rounds_count_positions_along_the_accepted_path():
    """A DDTree round drafts tree nodes (no positions): its per-position series run along the accepted
    path, position k counting the rounds whose tree could reach depth k (`depths`) and those whose
    accepted path did; without them a DDTree deployment had no per-position series at all."""
    ins = PrometheusInstruments()
    m = SpecMetrics(ins, "dflash")
    # Two requests, trees of 12 and 2 nodes over 7 drafter slots (depth at most 7 and 2); accepted paths 3 and 2.
    m.round("ddtree", [12, 2], [4, 3], 0.01, 0.02, depths=[7, 2])
    m.flush()
    t = totals(_exported(ins), "dflash", "ddtree")
    assert (t.drafted, t.accepted, t.rounds) == (14, 5, 2)
    assert t.drafted_per_pos == {1: 2, 2: 2, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1}
    assert t.accepted_per_pos == {1: 2, 2: 2, 3: 1}
    assert t.per_position() == pytest.approx([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])


def test_counters_reach_the_instruments_at_most_flush_s_late():
    """A round's counter increments are summed and handed over once flush_s has passed since the
    last hand-over (the engine also flushes when it goes idle): a few instrument calls a round."""
    calls = []

    class Recording:
        def add(self, metric, labels, value):
            calls.append(("add", metric.name, dict(labels), value))

        def observe(self, metric, labels, value):
            calls.append(("observe", metric.name))

    m = SpecMetrics(Recording(), "m", flush_s=3600)
    for _ in range(5):
        m.round("dflash", [3, 3], [4, 2], 0.01, 0.02)
    assert {c[0] for c in calls} == {"observe"}  # histograms as they come, counters held
    m.flush()
    adds = {(name, labels.get("position")): v for kind, name, labels, v in [c for c in calls if c[0] == "add"]}
    assert adds[("dflash_spec_decode_draft_tokens_total", None)] == 30
    assert adds[("dflash_spec_decode_accepted_tokens_per_pos_total", "1")] == 10
    m.flush_s = 0.0
    m.round("dflash", [1], [2], 0.01, 0.02)
    assert calls[-1][0] == "add"  # due: handed over with the round


def test_every_defined_metric_is_exported_under_its_one_name():
    ins = PrometheusInstruments()
    m = SpecMetrics(ins, "m")
    m.round("dflash", [2], [2], 0.001, 0.002)
    m.flush()
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


def _schema_problems(obj, data, path: str, out: list) -> None:
    """Where `data` (dashboard JSON) and its decoding `obj` (grafana_foundation_sdk models) differ:
    a key the schema's type always has but the JSON lacks (the SDK's to_json of a default object
    writes exactly the required keys), and a key the schema does not know (decoding drops it).
    Panel targets are the data source plugin's own (prometheus: refId, expr) and checked apart."""
    if type(obj).__name__ == "UnknownDataquery":
        missing = {"refId", "expr"} - set(data)
        out += [f"{path}: missing {k}" for k in sorted(missing)]
    elif hasattr(obj, "to_json") and isinstance(data, dict):
        full = obj.to_json()
        out += [f"{path}: missing {k} (required by {type(obj).__name__})"
                for k in sorted(set(type(obj)().to_json()) - set(data))]
        out += [f"{path}: unknown {k} ({type(obj).__name__} has no such field)" for k in sorted(set(data) - set(full))]
        for k, v in full.items():
            if k in data:
                _schema_problems(v, data[k], f"{path}/{k}", out)
    elif isinstance(obj, list) and isinstance(data, list):
        for i, (o, d) in enumerate(zip(obj, data)):
            _schema_problems(o, d, f"{path}[{i}]", out)


def test_the_grafana_dashboard_passes_grafanas_dashboard_schema():
    """docs/grafana-dflash.json against Grafana's dashboard schema as Grafana Labs ships it for
    Python: the grafana-foundation-sdk package (models/dashboard.py, generated from Grafana's schema;
    read at 10.1.0): every field its types require is present (the dashboard lacked annotations,
    graphTooltip, style, ... and the variables' hide / skipUrlSync / ...), and no field is one the
    schema does not know (the variables' `definition` was)."""
    import json
    from pathlib import Path

    dashboard = pytest.importorskip("grafana_foundation_sdk.models.dashboard",
                                    reason="needs grafana-foundation-sdk (the dev extra)")
    data = json.loads((Path(__file__).resolve().parents[2] / "docs" / "grafana-dflash.json").read_text())
    problems: list[str] = []
    _schema_problems(dashboard.Dashboard.from_json(data), data, "", problems)
    assert problems == []
    assert data["annotations"]["list"] and all(p["type"] == "timeseries" for p in data["panels"])
