"""Pareto fronts of throughput-vs-interactivity curves and the headline ratios between two of them.

A curve is a list of points (tokens/s/user, tokens/s/GPU), one per measured or projected level;
higher is better on both axes. Labels (the concurrency of each point, say) travel beside the
points in a `Curve`. Everything here is a pure function of its arguments: the same code compares
a projection with a projection, a sweep with a sweep, or one with the other.

The ratios are NVIDIA's way of comparing speculative decoding with AR decoding:

- throughput ratio at equal interactivity: at each tokens/s/user that BOTH fronts reach, the
  tokens/s/GPU of one front over the other's, each read off its front by linear interpolation
  between neighbouring front points ("N x the throughput at 500-600 tok/s/user"). A front
  reaches the tokens/s/user between its slowest and its fastest point; fronts whose ranges do
  not overlap have no ratio (an empty list, never an extrapolation);
- the highest tokens/s/user each curve reaches;
- the tokens/s/user ratio at equal labels (equal concurrency): per-request speed-up.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

Point = tuple[float, float]  # (tokens/s/user, tokens/s/GPU)


@dataclass(frozen=True)
class Curve:
    """Named points with optional labels (one per point, e.g. the concurrency)."""

    name: str
    points: tuple[Point, ...]
    labels: tuple[Hashable, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "points", tuple((float(x), float(y)) for x, y in self.points))
        object.__setattr__(self, "labels", tuple(self.labels))
        if self.labels and len(self.labels) != len(self.points):
            raise ValueError(f"curve {self.name!r}: {len(self.labels)} labels for {len(self.points)} points")


def pareto_front(points: Sequence[Point]) -> list[int]:
    """Indices of the points no other point beats on both axes (higher is better on both)."""
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any(
            (x2 >= x and y2 >= y) and (x2 > x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i
        )
        if not dominated:
            front.append(i)
    return front


def front(points: Sequence[Point]) -> list[Point]:
    """The front's points in increasing tokens/s/user (so decreasing tokens/s/GPU), duplicates once."""
    return sorted({(float(points[i][0]), float(points[i][1])) for i in pareto_front(points)})


def max_user_rate(points: Sequence[Point]) -> float | None:
    """The highest tokens/s/user any point reaches (None for no points)."""
    return max((p[0] for p in points), default=None)


def throughput_at(points: Sequence[Point], user_rate: float) -> float | None:
    """tokens/s/GPU of the front at `user_rate` tokens/s/user, linear between neighbouring front
    points; None outside the front's range of tokens/s/user."""
    f = front(points)
    if not f or not f[0][0] <= user_rate <= f[-1][0]:
        return None
    for (x0, y0), (x1, y1) in itertools.pairwise(f):
        if x0 <= user_rate <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (user_rate - x0) / (x1 - x0)
    return f[0][1]  # a one-point front, exactly at its tokens/s/user


def overlap(a: Sequence[Point], b: Sequence[Point]) -> tuple[float, float] | None:
    """The range of tokens/s/user both fronts reach, or None."""
    fa, fb = front(a), front(b)
    if not fa or not fb:
        return None
    lo, hi = max(fa[0][0], fb[0][0]), min(fa[-1][0], fb[-1][0])
    return (lo, hi) if lo <= hi else None


def throughput_ratios(num: Sequence[Point], den: Sequence[Point],
                      user_rates: Sequence[float] | None = None) -> list[tuple[float, float]]:
    """(tokens/s/user, tokens/s/GPU of `num` / tokens/s/GPU of `den`) at each tokens/s/user both
    fronts reach. Default rates: every front point of either curve inside the overlap (where the
    interpolated fronts bend). Rates outside the overlap are left out; [] when none is inside."""
    span = overlap(num, den)
    if span is None:
        return []
    lo, hi = span
    if user_rates is None:
        user_rates = sorted({x for x, _ in front(num) + front(den) if lo <= x <= hi} | {lo, hi})
    out = []
    for x in user_rates:
        yn, yd = throughput_at(num, x), throughput_at(den, x)
        if yn is not None and yd is not None and yd > 0:
            out.append((float(x), yn / yd))
    return out


def band_ratio(num: Sequence[Point], den: Sequence[Point], lo: float, hi: float) -> tuple[float, float] | None:
    """(smallest, largest) throughput ratio over the tokens/s/user band [lo, hi], at the band's
    edges and the front points inside it, where both fronts reach; None when they reach no rate
    of the band together."""
    span = overlap(num, den)
    if span is None or lo > hi:
        return None
    a, b = max(lo, span[0]), min(hi, span[1])
    if a > b:
        return None
    xs = sorted({a, b} | {x for x, _ in front(num) + front(den) if a <= x <= b})
    ratios = [r for _, r in throughput_ratios(num, den, xs)]
    return (min(ratios), max(ratios)) if ratios else None


def user_rate_ratios(num: Curve, den: Curve) -> dict[Hashable, float]:
    """tokens/s/user of `num` / tokens/s/user of `den` at every label both curves have (equal
    concurrency when the labels are concurrencies), in `num`'s order."""
    by_label = dict(zip(den.labels, den.points))
    return {lab: p[0] / by_label[lab][0] for lab, p in zip(num.labels, num.points)
            if lab in by_label and by_label[lab][0] > 0}


@dataclass(frozen=True)
class Comparison:
    """The headline numbers of `num` against `den` (see the module docstring)."""

    num: str
    den: str
    throughput_ratios: list[tuple[float, float]]
    overlap: tuple[float, float] | None
    max_user_rate: dict[str, float | None]
    user_rate_ratios: dict[Hashable, float]
    bands: dict[str, tuple[float, float] | None] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "num": self.num, "den": self.den,
            "throughput_ratios": [{"tok_s_user": x, "ratio": r} for x, r in self.throughput_ratios],
            "overlap_tok_s_user": list(self.overlap) if self.overlap else None,
            "max_tok_s_user": self.max_user_rate,
            "tok_s_user_ratio_at_equal_label": {str(k): v for k, v in self.user_rate_ratios.items()},
            "band_ratios": {k: (None if v is None else {"min": v[0], "max": v[1]}) for k, v in self.bands.items()},
        }


def compare(num: Curve, den: Curve, bands: Sequence[tuple[float, float]] = ()) -> Comparison:
    """All headline numbers of `num` against `den`; `bands` are tokens/s/user ranges (lo, hi)."""
    return Comparison(
        num=num.name, den=den.name,
        throughput_ratios=throughput_ratios(num.points, den.points),
        overlap=overlap(num.points, den.points),
        max_user_rate={num.name: max_user_rate(num.points), den.name: max_user_rate(den.points)},
        user_rate_ratios=user_rate_ratios(num, den),
        bands={f"{lo:g}-{hi:g}": band_ratio(num.points, den.points, lo, hi) for lo, hi in bands},
    )
