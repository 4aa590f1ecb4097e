"""Read the server's own speculative-decoding counters from its Prometheus /metrics.

Both servers export the METRICS of spec_metrics.py (serve/metrics.py): Triton on its metrics port
(`http://HOST:METRICS_PORT/metrics`), the OpenAI server on `/metrics` beside `/v1`. The sweep
scrapes before and after a level and reports the server-side tau of that level (the counters'
growth) beside the client-side tau it computes from the responses: they agree when the server
decoded only the sweep's requests.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass, field

from trtllm_dflash.spec_metrics import (
    ACCEPTED_PER_POS,
    ACCEPTED_TOKENS,
    DRAFT_PER_POS,
    DRAFT_TOKENS,
    REQUEST_DRAFT_LEN,
    ROUNDS,
)

Samples = dict[str, list[tuple[dict[str, str], float]]]  # sample name -> [(labels, value)]


def parse(text: str) -> Samples:
    """The samples of a Prometheus text exposition (prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def scrape(url: str, timeout: float = 10.0) -> Samples | None:
    """The samples at `url`; None when it cannot be read (the sweep reports no server-side numbers)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return parse(r.read().decode())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def settled(url: str, model: str | None = None, tries: int = 20, wait_s: float = 0.05) -> Samples | None:
    """The samples at `url` once the rounds counter of `model` stops moving (the Triton model hands
    its updates to the server from a thread of its own, so the last round of a level may land a
    moment after its last response): two equal reads in a row, at most `tries` reads."""
    import time

    last = scrape(url)
    for _ in range(tries):
        if last is None:
            return None
        time.sleep(wait_s)
        now = scrape(url)
        if now is None or totals(now, model).rounds == totals(last, model).rounds:
            return now
        last = now
    return last


@dataclass
class SpecTotals:
    drafted: float = 0.0
    accepted: float = 0.0
    rounds: float = 0.0
    drafted_per_pos: dict[int, float] = field(default_factory=dict)
    accepted_per_pos: dict[int, float] = field(default_factory=dict)
    rounds_by_draft_len: dict[int, float] = field(default_factory=dict)  # a request's rounds, by its drafts

    @property
    def tau(self) -> float | None:
        """Tokens committed per verify pass: each round commits its accepted drafts + one bonus token."""
        return 1.0 + self.accepted / self.rounds if self.rounds else None

    def minus(self, before: "SpecTotals") -> "SpecTotals":
        def sub(a, b):
            return {k: v - b.get(k, 0.0) for k, v in a.items()}

        return SpecTotals(self.drafted - before.drafted, self.accepted - before.accepted, self.rounds - before.rounds,
                          sub(self.drafted_per_pos, before.drafted_per_pos),
                          sub(self.accepted_per_pos, before.accepted_per_pos),
                          sub(self.rounds_by_draft_len, before.rounds_by_draft_len))

    def per_position(self) -> list[float]:
        """Acceptance at positions 1, 2, ... (accepted / drafted there)."""
        return [self.accepted_per_pos.get(k, 0.0) / self.drafted_per_pos[k]
                for k in sorted(self.drafted_per_pos) if self.drafted_per_pos[k]]


def totals(samples: Samples, model: str | None = None, mode: str | None = None) -> SpecTotals:
    """The counters of `model` (every model when None) summed over modes, or of one `mode`."""
    def pick(metric) -> list[tuple[dict[str, str], float]]:
        return [(lab, v) for lab, v in samples.get(metric.name, [])
                if (model is None or lab.get("model") == model) and (mode is None or lab.get("mode") == mode)]

    def by(metric, label: str) -> dict[int, float]:
        out: dict[int, float] = {}
        for lab, v in pick(metric):
            out[int(lab[label])] = out.get(int(lab[label]), 0.0) + v
        return out

    return SpecTotals(sum(v for _, v in pick(DRAFT_TOKENS)), sum(v for _, v in pick(ACCEPTED_TOKENS)),
                      sum(v for _, v in pick(ROUNDS)), by(DRAFT_PER_POS, "position"), by(ACCEPTED_PER_POS, "position"),
                      by(REQUEST_DRAFT_LEN, "draft_len"))
