"""A sweep's files: results.jsonl (one row per request), summary.csv and summary.json (one row
per curve and level), headline.json, sweep.png (every curve with its Pareto front), and, for
`sweep --tune`, tune.json (sweep/tune.py); and reading them back.

summary.json is a list of level rows (sweep/metrics.py LevelSummary, with `curve`, `mode` and
`draft_len`), each also saying whether it is on its curve's Pareto front (`on_front`) and, for
the DFlash and DDTree curves of a sweep with an AR curve, its headline ratios against AR:
  "vs_ar": {"tok_s_user_ratio": at equal concurrency (None if AR lacks the level),
            "tok_s_gpu_ratio": at this level's tokens/s/user, both fronts interpolated (None
                               outside the tokens/s/user both fronts reach)}
headline.json: {"title", "fronts": {curve: [concurrency on the front]}, "headline":
{"dflash_vs_ar": fronts.Comparison as JSON, "ddtree_vs_ar": ...}}: the throughput ratios at every
front point inside the overlap, the overlap, the highest tokens/s/user of each curve, the
tokens/s/user ratios at equal concurrency. Older sweeps wrote rows without a curve: they read
back as one curve named "".
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from pathlib import Path

from trtllm_dflash.sweep.fronts import Comparison, compare, pareto_front
from trtllm_dflash.sweep.metrics import LevelSummary, RequestRecord, by_curve, curve_of, points

SUMMARY = "summary.json"
HEADLINE_FILE = "headline.json"
TUNE_FILE = "tune.json"
BASELINE = "ar"
HEADLINE = ("dflash", "ddtree")  # the curves compared with AR in the headline


def headline(curves: dict[str, list[LevelSummary]]) -> dict[str, Comparison]:
    """Each of DFlash and DDTree against AR (when the sweep has both): throughput ratios at equal
    tokens/s/user on the fronts, the highest tokens/s/user, tokens/s/user ratios at equal concurrency."""
    if BASELINE not in curves:
        return {}
    ar = curve_of(BASELINE, curves[BASELINE])
    return {f"{name}_vs_{BASELINE}": compare(curve_of(name, curves[name]), ar) for name in HEADLINE if name in curves}


def write(out_dir: Path, rows: list[LevelSummary], records: list[RequestRecord], title: str,
          tune: dict | None = None) -> dict:
    """Write every file of a sweep; returns {"levels": summary.json's rows, **headline.json}."""
    from trtllm_dflash.sweep.fronts import throughput_ratios
    from trtllm_dflash.sweep.report import plot_curves

    out_dir = Path(out_dir)
    with open(out_dir / "results.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r.to_json()) + "\n")
    flat = [s.flat() for s in rows]
    with open(out_dir / "summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(flat[0]))
        w.writeheader()
        w.writerows(flat)
    curves = by_curve(rows)
    fronts = {name: [cr[i].concurrency for i in sorted(pareto_front(points(cr)))] for name, cr in curves.items()}
    comparisons = headline(curves)
    levels = []
    ar_pts = points(curves[BASELINE]) if BASELINE in curves else []
    for name, cr in curves.items():
        versus = comparisons.get(f"{name}_vs_{BASELINE}")
        pts = points(cr)
        for row, (x, _) in zip(cr, pts):
            d = {**asdict(row), "on_front": row.concurrency in fronts[name]}
            if versus is not None:
                gpu = throughput_ratios(pts, ar_pts, [x])
                d["vs_ar"] = {"tok_s_user_ratio": versus.user_rate_ratios.get(row.concurrency),
                              "tok_s_gpu_ratio": gpu[0][1] if gpu else None}
            levels.append(d)
    (out_dir / SUMMARY).write_text(json.dumps(levels, indent=1))
    head = {"title": title, "fronts": fronts, "headline": {key: c.to_json() for key, c in comparisons.items()}}
    (out_dir / HEADLINE_FILE).write_text(json.dumps(head, indent=2))
    if tune is not None:
        (out_dir / TUNE_FILE).write_text(json.dumps(tune, indent=2))
    plot_curves(curves, out_dir / "sweep.png", title)
    return {"levels": levels, **head, **({"tune": tune} if tune is not None else {})}


def read_curves(out: Path) -> dict[str, list[LevelSummary]]:
    """Every curve's level rows of a finished sweep directory, by curve ("" for rows of a sweep
    that named no curves)."""
    return by_curve([LevelSummary.from_json(d) for d in json.loads((Path(out) / SUMMARY).read_text())])


def read_headline(out: Path) -> dict[str, dict]:
    """headline.json's comparisons ({} for a sweep without an AR curve, or an older sweep)."""
    path = Path(out) / HEADLINE_FILE
    return json.loads(path.read_text()).get("headline", {}) if path.is_file() else {}
