"""Speculative-decoding metrics of a running server: one definition, two exporters.

The serving engine (serve/batcher.py) reports every verify round to a `SpecMetrics`, which
turns it into counter increments and histogram observations on an `Instruments`: the OpenAI
server's is a prometheus_client registry served on its /metrics (`PrometheusInstruments`), the
Triton model's is the Python backend's custom metrics (`TritonInstruments`: they appear on
tritonserver's metrics port beside Triton's own). `METRICS` (trtllm_dflash/spec_metrics.py,
a module of plain data that serving and the sweep both import) is the one list of names, kinds,
help texts and buckets; the Grafana dashboard (docs/grafana-dflash.json) and the sweep's
server-side tau (sweep/server_metrics.py) read these names and nothing else.

Names follow vLLM's speculative-decoding metrics (`spec_decode_num_draft_tokens`,
`spec_decode_num_accepted_tokens`, `spec_decode_num_accepted_tokens_per_pos`), prefixed
`dflash_` (Prometheus names; vLLM's `vllm:` colon form is reserved for recording rules).
Every series is labelled `model` (the served model name) and `mode` (ar | dflash | ddtree: how
the round was decoded; requests may choose their own mode). From them:

    tau                    = 1 + accepted / rounds          (tokens committed per verify pass)
    acceptance at pos k    = accepted_per_pos{k} / drafted_per_pos{k}
    draft acceptance rate  = accepted / drafted

Per-position series: a chain round (mode dflash) drafts positions 1..n and accepts a prefix, so
position k counts the rounds that drafted it and those that accepted it. A DDTree round's drafted
tokens are tree nodes, with no single position; its series run along the accepted path instead:
position k counts the tree rounds whose tree could reach depth k (n nodes over the drafter's D
slots reach at most min(n, D): `depths`) and those whose accepted path did. Both read as "how
often the k-th drafted token is accepted" on one dashboard panel.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from typing import Protocol

from trtllm_dflash.spec_metrics import (  # noqa: F401  (the one definition; re-exported for the front ends)
    ACCEPTED_PER_POS,
    ACCEPTED_TOKENS,
    CHAIN_MODES,
    COUNTER,
    DRAFT_LEN,
    DRAFT_PER_POS,
    DRAFT_TIME,
    DRAFT_TOKENS,
    HISTOGRAM,
    LABELS,
    METRICS,
    POSITION_MODES,
    REQUEST_DRAFT_LEN,
    ROUNDS,
    VERIFY_BATCH,
    VERIFY_TIME,
    MetricDef,
)


class Instruments(Protocol):
    """Where SpecMetrics writes (every implementation: tests/serve/test_spec_metrics.py)."""

    def add(self, metric: MetricDef, labels: dict[str, str], value: float) -> None:
        """Increase counter `metric` of series `labels` by `value` (> 0)."""

    def observe(self, metric: MetricDef, labels: dict[str, str], value: float) -> None:
        """Record one observation of histogram `metric`."""


class SpecMetrics:
    """Turns the engine's rounds into metric updates. One per server; called on the engine thread.
    A round costs O(requests + positions): counts are taken once per round, label sets are built
    once per server (`_labels`), and counter increments are summed here and handed to the
    instruments every `flush_s` seconds (and whenever the engine goes idle or stops, and before a
    request's last update: `flush`), so a round makes a handful of instrument calls, not one per
    series (a scrape sees counters at most flush_s old, and a finished request's rounds in them).
    Histograms get every observation as it comes."""

    def __init__(self, instruments: Instruments, model: str, flush_s: float = 0.05):
        self.instruments, self.model, self.flush_s = instruments, model, flush_s
        self._label_sets: dict[tuple, dict[str, str]] = {}
        self._pending: dict[tuple, list] = {}  # (metric name, labels id) -> [metric, labels, sum]
        self._positions: dict[str, tuple[list[int], list[int]]] = {}  # mode -> per position: (drafted, accepted)
        self._flushed = time.monotonic()

    def _add(self, metric: MetricDef, labels: dict[str, str], value: float) -> None:
        entry = self._pending.get((metric.name, id(labels)))
        if entry is None:
            self._pending[(metric.name, id(labels))] = [metric, labels, value]
        else:
            entry[2] += value

    def flush(self) -> None:
        """Hand the summed counter increments to the instruments."""
        positions, self._positions = self._positions, {}
        for mode, (reach, hits) in positions.items():  # one series per position: summed apart until now
            for k in range(1, len(reach)):
                pos = self._labels(mode, "position", k)
                self._add(DRAFT_PER_POS, pos, reach[k])
                if hits[k]:
                    self._add(ACCEPTED_PER_POS, pos, hits[k])
        pending, self._pending = self._pending, {}
        self._flushed = time.monotonic()
        for metric, labels, value in pending.values():
            self.instruments.add(metric, labels, value)

    def _labels(self, mode: str, name: str | None = None, value: int = 0) -> dict[str, str]:
        """{model, mode} (and name: str(value)), the same dict every time: the instruments look their
        series up by it."""
        key = (mode, name, value)
        found = self._label_sets.get(key)
        if found is None:
            found = {"model": self.model, "mode": mode}
            if name is not None:
                found[name] = str(value)
            self._label_sets[key] = found
        return found

    def round(self, mode: str, drafted: list[int], committed: list[int], t_draft: float, t_verify: float,
              depths: list[int] | None = None) -> None:
        """One verify pass of a group: per request, the drafts verified and the tokens committed
        (accepted drafts + the bonus token); `depths`: per request, the deepest position it could
        accept (a tree round's; default: its drafts, a chain's)."""
        if not drafted:
            return
        ins, add, labels = self.instruments, self._add, self._labels(mode)
        accepted = [max(0, min(c - 1, d)) for d, c in zip(drafted, committed)]
        total_drafted, total_accepted = sum(drafted), sum(accepted)
        add(ROUNDS, labels, len(drafted))
        if total_drafted:
            add(DRAFT_TOKENS, labels, total_drafted)
            ins.observe(DRAFT_TIME, labels, t_draft)
        if total_accepted:
            add(ACCEPTED_TOKENS, labels, total_accepted)
        for n, count in sorted(Counter(drafted).items()):
            add(REQUEST_DRAFT_LEN, self._labels(mode, "draft_len", n), count)
        ins.observe(DRAFT_LEN, labels, max(drafted))
        ins.observe(VERIFY_BATCH, labels, len(drafted))
        ins.observe(VERIFY_TIME, labels, t_verify)
        if mode in POSITION_MODES:
            self._per_position(mode, depths if depths is not None else drafted, accepted)
        if time.monotonic() - self._flushed >= self.flush_s:
            self.flush()

    def _per_position(self, mode: str, drafted: list[int], accepted: list[int]) -> None:
        # A chain accepts a prefix of its drafts: position k is accepted iff k <= accepted. Summed
        # per position in two lists (the label look-ups wait for flush: 2 per position, not per round)
        reach, hits = at_least(drafted), at_least(accepted)
        sums = self._positions.get(mode)
        if sums is None:
            sums = self._positions[mode] = ([], [])
        for total, new in zip(sums, (reach, hits)):
            if len(total) < len(reach):
                total += [0] * (len(reach) - len(total))
            total[: len(new)] = [a + b for a, b in zip(total, new)]


def at_least(values: list[int]) -> list[int]:
    """[k] = how many values are >= k, for k = 0..max(values)."""
    counts = [0] * (max(values, default=0) + 1)
    for v in values:
        counts[v] += 1
    for k in range(len(counts) - 2, -1, -1):
        counts[k] += counts[k + 1]
    return counts


class PrometheusInstruments:
    """METRICS on a prometheus_client registry of their own (the OpenAI server's /metrics)."""

    def __init__(self, registry=None):
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.families = {}
        self.series: dict[tuple, object] = {}  # (name, labels) -> the family's child: labels() is a lookup with checks
        for m in METRICS:
            if m.kind == COUNTER:  # prometheus_client adds _total itself
                self.families[m.name] = Counter(m.name.removesuffix("_total"), m.help, m.labels, registry=self.registry)
            else:
                self.families[m.name] = Histogram(m.name, m.help, m.labels, buckets=m.buckets, registry=self.registry)

    def _series(self, metric: MetricDef, labels: dict[str, str]):
        key = (metric.name, *labels.items())
        found = self.series.get(key)
        if found is None:
            found = self.series[key] = self.families[metric.name].labels(**labels)
        return found

    def add(self, metric: MetricDef, labels: dict[str, str], value: float) -> None:
        self._series(metric, labels).inc(value)

    def observe(self, metric: MetricDef, labels: dict[str, str], value: float) -> None:
        self._series(metric, labels).observe(value)

    def exposition(self) -> tuple[bytes, str]:
        """(body, content type) of a /metrics response."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class TritonInstruments:
    """METRICS as Triton Python-backend custom metrics (`pb_utils.MetricFamily`, COUNTER and
    HISTOGRAM kinds; `family.Metric(labels=, buckets=)`, `metric.increment(v)` /
    `metric.observe(v)`), served on tritonserver's metrics port. Read in
    triton-inference-server/python_backend src/pb_stub.cc (the `MetricFamily` / `Metric`
    bindings: older releases had COUNTER and GAUGE only, HISTOGRAM with `buckets` came later);
    the stub nvidia-pytriton 0.7.0 bundles (Triton 24.10) has HISTOGRAM and its bucket checks,
    and the served tests export through it (tests/serve/test_server.py). Each call is a round trip to the server
    process, so updates go through a thread of their own and the engine thread never waits for them."""

    def __init__(self, pb_utils):
        self.pb = pb_utils
        kinds = {COUNTER: pb_utils.MetricFamily.COUNTER, HISTOGRAM: pb_utils.MetricFamily.HISTOGRAM}
        self.families = {m.name: pb_utils.MetricFamily(name=m.name, description=m.help, kind=kinds[m.kind])
                         for m in METRICS}
        self.series: dict[tuple, object] = {}
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="dflash-metrics", daemon=True)
        self.thread.start()

    def add(self, metric: MetricDef, labels: dict[str, str], value: float) -> None:
        self.queue.put((metric, labels, "increment", value))

    def observe(self, metric: MetricDef, labels: dict[str, str], value: float) -> None:
        self.queue.put((metric, labels, "observe", value))

    def _series(self, metric: MetricDef, labels: dict[str, str]):
        key = (metric.name, tuple(sorted(labels.items())))
        if key not in self.series:
            family = self.families[metric.name]
            extra = {"buckets": list(metric.buckets)} if metric.kind == HISTOGRAM else {}
            self.series[key] = family.Metric(labels=labels, **extra)
        return self.series[key]

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            metric, labels, op, value = item
            try:
                getattr(self._series(metric, labels), op)(value)
            except Exception as e:  # metrics must never take serving down
                self.pb.Logger.log_warn(f"dflash: metric {metric.name} not updated: {type(e).__name__}: {e}")

    def close(self) -> None:
        """Stop the thread; series go before their families (the stub refuses the other order)."""
        self.queue.put(None)
        self.thread.join(timeout=10)
        self.series.clear()
        self.families.clear()
