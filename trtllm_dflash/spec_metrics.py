"""The speculative-decoding metrics every server exports: one definition of names, kinds, help
texts, labels and buckets. Plain data, importing nothing of the package: serve/metrics.py
exports them, sweep/server_metrics.py reads them back, docs/grafana-dflash.json queries them
(tests/serve/test_spec_metrics.py checks the dashboard against METRICS). Semantics: serve/metrics.py.
"""

from __future__ import annotations

from dataclasses import dataclass

COUNTER, HISTOGRAM = "counter", "histogram"
LABELS = ("model", "mode")


@dataclass(frozen=True)
class MetricDef:
    name: str  # the exported name (counters end in _total, as Prometheus clients expose them)
    kind: str  # COUNTER | HISTOGRAM
    help: str
    labels: tuple[str, ...] = LABELS
    buckets: tuple[float, ...] = ()  # histograms only; +Inf is implied


_TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

DRAFT_TOKENS = MetricDef("dflash_spec_decode_draft_tokens_total", COUNTER,
                         "Draft tokens verified by the target (every request, every round).")
ACCEPTED_TOKENS = MetricDef("dflash_spec_decode_accepted_tokens_total", COUNTER,
                            "Draft tokens accepted (committed tokens minus the target's bonus token).")
ROUNDS = MetricDef("dflash_spec_decode_rounds_total", COUNTER,
                   "Target verify passes, counted per request (the prefill is not a round).")
DRAFT_PER_POS = MetricDef("dflash_spec_decode_draft_tokens_per_pos_total", COUNTER,
                          "Rounds that drafted a token at this 1-based position (DDTree: whose tree could "
                          "reach this depth).", LABELS + ("position",))
ACCEPTED_PER_POS = MetricDef("dflash_spec_decode_accepted_tokens_per_pos_total", COUNTER,
                             "Rounds whose draft at this 1-based position was accepted (DDTree: whose accepted "
                             "path reached this depth).", LABELS + ("position",))
REQUEST_DRAFT_LEN = MetricDef("dflash_spec_decode_request_rounds_total", COUNTER,
                              "Verify passes of one request, by the draft length that request ran (0: plain "
                              "decoding for it in that pass; `draft_len: auto` chooses one per request).",
                              LABELS + ("draft_len",))
DRAFT_LEN = MetricDef("dflash_spec_decode_draft_len", HISTOGRAM,
                      "Draft length chosen for a verify pass (the largest of its requests).",
                      buckets=(0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64))
VERIFY_BATCH = MetricDef("dflash_verify_batch_size", HISTOGRAM, "Requests verified together in one target pass.",
                         buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
DRAFT_TIME = MetricDef("dflash_draft_time_seconds", HISTOGRAM, "Drafter pass time of a round that drafted.",
                       buckets=_TIME_BUCKETS)
VERIFY_TIME = MetricDef("dflash_verify_time_seconds", HISTOGRAM, "Target verify pass time of a round.",
                        buckets=_TIME_BUCKETS)

METRICS = (DRAFT_TOKENS, ACCEPTED_TOKENS, ROUNDS, DRAFT_PER_POS, ACCEPTED_PER_POS, REQUEST_DRAFT_LEN, DRAFT_LEN,
           VERIFY_BATCH, DRAFT_TIME, VERIFY_TIME)
CHAIN_MODES = ("dflash",)  # modes whose drafts have positions
POSITION_MODES = ("dflash", "ddtree")  # modes with per-position series (DDTree: along the accepted path)
