"""Serving metrics: one definition everywhere (this module).

All functions are pure: they take timestamps recorded by a client and return numbers.
Times are integer nanoseconds from `time.perf_counter_ns()`; results are in seconds.

- TTFT = first chunk arrival - request start
- TPOT = (E2E - TTFT) / (output tokens - 1)          (undefined for a single output token)
- tokens/s/user = 1 / TPOT
- inter-chunk latency = gaps between consecutive chunk arrivals (speculative decoding streams
  several tokens per chunk, so this is not per token)
- output tokens/s per GPU = all output tokens of a level / level wall time / GPUs
- tau (acceptance length) = tokens committed per target verify pass, bonus token included;
  the first token comes from the prefill, not from a verify pass, so tau = (tokens - 1) / rounds
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from trtllm_dflash.sweep.fronts import Curve, pareto_front  # noqa: F401  (pareto_front's home is fronts.py; kept importable here)

NS = 1e-9


@dataclass
class RequestRecord:
    """What the load generator saw for one request."""

    request_id: int
    concurrency: int
    start_ns: int
    chunk_ns: list[int] = field(default_factory=list)  # arrival time of every non-empty chunk
    chunk_tokens: list[int] = field(default_factory=list)  # tokens carried by each chunk
    end_ns: int = 0
    text: str = ""
    rounds: int = 0  # target verify passes reported by the server
    error: str | None = None
    warmup: bool = False
    curve: str = ""  # which curve of the sweep the request belongs to (its mode, or e.g. "dflash L=3")
    mode: str | None = None  # the request's decoding ("ar" | "dflash" | "ddtree"); None: the server's default
    draft_len: int | None = None  # drafts per round the request asked for; None: the server's policy
    drafted: int = 0  # draft tokens the server verified for it (total_draft_tokens)
    repeat: int = 0
    # Its acceptance as the server's responses counted it: accepted drafts (total_accepted_draft_tokens)
    # and verify passes by drafts accepted; None where they did not say. acceptance_source: "response"
    # when they did, else None
    accepted: int | None = None
    acceptance_histogram: list[int] | None = None
    acceptance_source: str | None = None

    @property
    def output_tokens(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def ok(self) -> bool:
        return self.error is None and self.output_tokens > 0

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(ttft_s=ttft(self), tpot_s=tpot(self), e2e_s=e2e(self), output_tokens=self.output_tokens)
        return d


def ttft(r: RequestRecord) -> float | None:
    return (r.chunk_ns[0] - r.start_ns) * NS if r.chunk_ns else None


def e2e(r: RequestRecord) -> float | None:
    return (r.end_ns - r.start_ns) * NS if r.end_ns else None


def tpot(r: RequestRecord) -> float | None:
    n, first, total = r.output_tokens, ttft(r), e2e(r)
    if n < 2 or first is None or total is None:
        return None
    return (total - first) / (n - 1)


def tokens_per_s_per_user(r: RequestRecord) -> float | None:
    t = tpot(r)
    return 1.0 / t if t else None


def inter_chunk_latencies(r: RequestRecord) -> list[float]:
    return [(b - a) * NS for a, b in zip(r.chunk_ns, r.chunk_ns[1:])]


def request_tau(r: RequestRecord) -> float | None:
    """Tokens committed per verify pass of one request, the bonus token counted: 1 + accepted / rounds
    from the server's own count where it gave one, else from the tokens the client received."""
    if not r.rounds:
        return None
    if r.accepted is not None:
        return 1.0 + r.accepted / r.rounds
    return (r.output_tokens - 1) / r.rounds


@dataclass(frozen=True)
class Distribution:
    n: int
    mean: float
    p50: float
    p90: float
    p99: float
    min: float
    max: float

    @staticmethod
    def of(values: list[float]) -> "Distribution | None":
        xs = sorted(v for v in values if v is not None and not math.isnan(v))
        if not xs:
            return None
        return Distribution(
            n=len(xs),
            mean=sum(xs) / len(xs),
            p50=percentile(xs, 50),
            p90=percentile(xs, 90),
            p99=percentile(xs, 99),
            min=xs[0],
            max=xs[-1],
        )


def percentile(sorted_xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    if not sorted_xs:
        raise ValueError("percentile of an empty list")
    pos = (len(sorted_xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


DISTRIBUTIONS = ("ttft_s", "tpot_s", "tok_s_user", "inter_chunk_s", "e2e_s")


@dataclass(frozen=True)
class Spread:
    """The per-request tau of a level: the p10 / p50 / p90 request's (numpy's linear percentiles)."""

    n: int
    p10: float
    p50: float
    p90: float

    @staticmethod
    def of(values: list[float | None]) -> "Spread | None":
        xs = sorted(v for v in values if v is not None and not math.isnan(v))
        if not xs:
            return None
        return Spread(len(xs), percentile(xs, 10), percentile(xs, 50), percentile(xs, 90))


@dataclass(frozen=True)
class LevelSummary:
    concurrency: int
    requests: int
    failed: int
    wall_s: float
    output_tokens: int
    output_tok_s: float
    output_tok_s_per_gpu: float
    tau: float | None  # pooled: tokens committed by verify passes / verify passes
    ttft_s: Distribution | None
    tpot_s: Distribution | None
    tok_s_user: Distribution | None
    inter_chunk_s: Distribution | None
    e2e_s: Distribution | None
    curve: str = ""  # the sweep's curve ("ar", "dflash", "ddtree", "dflash L=3", ...); "" in old summaries
    mode: str | None = None  # requested decoding; None: the server's default
    draft_len: int | None = None  # requested drafts per round; None: the server's policy
    draft_per_round: float | None = None  # draft tokens verified per verify pass (what the policy chose, on average)
    # tau from the server's own /metrics counters over the level (sweep/server_metrics.py): its verify
    # passes of every request of the level, the warm-up ones included; None when they were not read
    server_tau: float | None = None
    # the server's request rounds of the level by the draft length each request ran (from the same
    # counters, keys as strings for JSON); None when they were not read
    server_draft_lens: dict[str, float] | None = None
    # tau of each request (request_tau), its spread over the level's measured requests; None when no
    # request reported verify passes. acceptance_source: where the requests' acceptance came from:
    # "response" (their own responses), "perf_metrics" / "accept_stats" (a TensorRT-LLM server's
    # per-request metrics / acceptance histograms, sweep/trtllm_acceptance.py), None when from nowhere
    tau_request: Spread | None = None
    acceptance_source: str | None = None

    @property
    def zero_draft_share(self) -> float | None:
        """Of the level's request rounds on the server, the share that drafted nothing."""
        total = sum(self.server_draft_lens.values()) if self.server_draft_lens else 0
        return self.server_draft_lens.get("0", 0.0) / total if total else None

    @classmethod
    def from_json(cls, d: dict) -> "LevelSummary":
        """The inverse of dataclasses.asdict (summary.json rows; keys that are not fields, such as
        sweep/summary.py's on_front and vs_ar, are left out)."""
        known = {f.name for f in fields(cls)}
        dists = {k: Distribution(**d[k]) if d.get(k) else None for k in DISTRIBUTIONS}
        dists["tau_request"] = Spread(**d["tau_request"]) if d.get("tau_request") else None
        return cls(**{k: v for k, v in {**d, **dists}.items() if k in known})

    def flat(self) -> dict:
        """One CSV row: scalars plus mean/p50/p90/p99 of each distribution."""
        scalars = ("curve", "mode", "draft_len", "concurrency", "requests", "failed", "wall_s", "output_tokens",
                   "output_tok_s", "output_tok_s_per_gpu", "tau", "draft_per_round", "server_tau", "zero_draft_share")
        row = {k: getattr(self, k) for k in scalars}
        for stat in ("p10", "p50", "p90"):
            row[f"tau_request_{stat}"] = getattr(self.tau_request, stat) if self.tau_request else None
        row["acceptance_source"] = self.acceptance_source
        for name in DISTRIBUTIONS:
            dist = getattr(self, name)
            for stat in ("mean", "p50", "p90", "p99"):
                row[f"{name}_{stat}"] = getattr(dist, stat) if dist else None
        return row


def summarize_level(records: list[RequestRecord], concurrency: int, gpus: int, curve: str = "",
                    mode: str | None = None, draft_len: int | None = None) -> LevelSummary:
    """Metrics of one concurrency level (of one curve); warm-up requests are excluded."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    if ok:
        wall = (max(r.end_ns for r in ok) - min(r.start_ns for r in ok)) * NS
    else:
        wall = 0.0
    tokens = sum(r.output_tokens for r in ok)
    rounds = sum(r.rounds for r in ok)
    verified = tokens - sum(1 for r in ok if r.rounds)  # tokens from verify passes (not the prefill's)
    tok_s = tokens / wall if wall > 0 else 0.0
    return LevelSummary(
        concurrency=concurrency,
        requests=len(measured),
        failed=len(measured) - len(ok),
        wall_s=wall,
        output_tokens=tokens,
        output_tok_s=tok_s,
        output_tok_s_per_gpu=tok_s / gpus,
        tau=verified / rounds if rounds else None,
        ttft_s=Distribution.of([ttft(r) for r in ok]),
        tpot_s=Distribution.of([tpot(r) for r in ok]),
        tok_s_user=Distribution.of([tokens_per_s_per_user(r) for r in ok]),
        inter_chunk_s=Distribution.of([g for r in ok for g in inter_chunk_latencies(r)]),
        e2e_s=Distribution.of([e2e(r) for r in ok]),
        curve=curve, mode=mode, draft_len=draft_len,
        draft_per_round=sum(r.drafted for r in ok) / rounds if rounds else None,
        tau_request=Spread.of([request_tau(r) for r in ok]),
        acceptance_source=_most_common([r.acceptance_source for r in ok if r.acceptance_source]),
    )


def _most_common(values: list[str]) -> str | None:
    return max(sorted(set(values)), key=values.count) if values else None


def points(rows: list[LevelSummary]) -> list[tuple[float, float]]:
    """(median tokens/s/user, output tokens/s/GPU) per level."""
    return [((s.tok_s_user.p50 if s.tok_s_user else 0.0), s.output_tok_s_per_gpu) for s in rows]


def by_curve(rows: list[LevelSummary]) -> dict[str, list[LevelSummary]]:
    """Rows grouped by curve, curves in order of first appearance ("" rows count as one curve)."""
    out: dict[str, list[LevelSummary]] = {}
    for r in rows:
        out.setdefault(r.curve, []).append(r)
    return out


def curve_of(name: str, rows: list[LevelSummary]) -> Curve:
    """A sweep's (or a projection's) rows as a fronts.Curve labelled by concurrency."""
    return Curve(name, points(rows), [r.concurrency for r in rows])
