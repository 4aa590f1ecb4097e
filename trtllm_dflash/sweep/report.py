"""Sweep reports: the level table and the headline table (rich, fit a 100-column terminal) and the
throughput-vs-interactivity plot with every curve and its Pareto front (matplotlib Agg)."""

from __future__ import annotations

from pathlib import Path

from trtllm_dflash.sweep.fronts import pareto_front
from trtllm_dflash.sweep.metrics import LevelSummary, by_curve, points
from trtllm_dflash.sweep.tune import fixed_curve

COLORS = {"ar": "#7f7f7f", "dflash": "#76b900", "ddtree": "#1f77b4"}
OTHER_COLORS = ("#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#ff7f0e")
LABELS = {"ar": "AR", "dflash": "DFlash", "ddtree": "DDTree", "": "DFlash"}


def label(curve: str) -> str:
    return LABELS.get(curve, curve)


def plot_curves(curves: dict[str, list[LevelSummary]], path: Path, title: str = "") -> Path:
    """Every curve (points joined in concurrency order) with its Pareto front (dashed, circled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.2, 4.8), dpi=120)
    others = iter(OTHER_COLORS * 4)
    for name, rows in curves.items():
        color = COLORS.get(name) or next(others)
        pts = points(rows)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color, label=label(name), zorder=2, markersize=4,
                linewidth=1, alpha=0.6)
        for s, (x, y) in zip(rows, pts):
            ax.annotate(f"c={s.concurrency}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7,
                        color=color)
        fx = sorted((pts[i] for i in pareto_front(pts)), key=lambda p: p[0])
        ax.plot([p[0] for p in fx], [p[1] for p in fx], "--", color=color, linewidth=2.2, zorder=3,
                label=f"{label(name)} Pareto front")
        ax.scatter([p[0] for p in fx], [p[1] for p in fx], s=80, facecolors="none", edgecolors=color, zorder=3)
    ax.set_xlabel("tokens/s/user (median, = 1/TPOT)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title(title or "throughput vs interactivity")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _num(x: float) -> str:
    """One decimal below 100, none above: a loaded machine's milliseconds keep the table in 100 columns."""
    return f"{x:.1f}" if abs(x) < 100 else f"{x:,.0f}"


def summary_table(summaries: list[LevelSummary], title: str = "sweep"):
    """One row per curve and level; * marks the levels on their curve's Pareto front."""
    from rich import box
    from rich.table import Table

    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    server = any(s.server_tau is not None for s in summaries)  # the server's /metrics were read
    spread = any(s.tau_request is not None for s in summaries)  # requests reported their verify passes
    for col in ("curve", "conc", "reqs", "tok/s\n/GPU", "tok/s\n/user", "TTFT\np50", "TTFT\np99", "TPOT\np50",
                "gap\np50", "tau", *(["tau/req\np10/50/90"] if spread else []), *(["tau\nserver"] if server else []),
                "drafts\n/round", *(["no\ndraft"] if server else [])):
        t.add_column(col, justify="left" if col == "curve" else "right", no_wrap=True)
    curves = by_curve(summaries)
    for n, (name, rows) in enumerate(curves.items()):
        front = set(pareto_front(points(rows)))
        for i, s in enumerate(rows):
            ms = lambda d, stat: _num(getattr(d, stat) * 1e3) if d else "-"  # noqa: E731
            cells = [
                label(name) if i == 0 else "", str(s.concurrency) + (" *" if i in front else "  "),
                str(s.requests) + (f" ({s.failed} failed)" if s.failed else ""),
                _num(s.output_tok_s_per_gpu), _num(s.tok_s_user.p50) if s.tok_s_user else "-",
                ms(s.ttft_s, "p50"), ms(s.ttft_s, "p99"), ms(s.tpot_s, "p50"), ms(s.inter_chunk_s, "p50"),
                f"{s.tau:.2f}" if s.tau else "unknown",  # the server reported no verify passes
                *([_spread(s.tau_request)] if spread else []),
                *([f"{s.server_tau:.2f}" if s.server_tau else "-"] if server else []),
                f"{s.draft_per_round:.1f}" if s.draft_per_round is not None and s.tau else "-",
                *([f"{s.zero_draft_share:.0%}" if s.zero_draft_share is not None else "-"] if server else []),
            ]
            t.add_row(*cells, end_section=i == len(rows) - 1 and n < len(curves) - 1)
    t.caption = ("times in ms (TTFT, TPOT, gap = between chunks); tau = tokens per verify pass (the level's requests "
                 "pooled; tau/req: the p10, p50 and p90 request's own); drafts/round = drafts "
                 "verified per pass; * = on the curve's Pareto front (tok/s/GPU vs tok/s/user)"
                 + _sources(summaries) + (
                     "; from the server's /metrics (warm-up requests included): tau server, and no draft = its "
                     "request rounds without drafts (plain decoding for that request)" if server else ""))
    return t


def _spread(t) -> str:
    return f"{t.p10:.1f}/{t.p50:.1f}/{t.p90:.1f}" if t else "-"


def _sources(summaries: list[LevelSummary]) -> str:
    """Where the per-request acceptance came from, when any level has it."""
    from trtllm_dflash.sweep.trtllm_acceptance import SOURCES

    used = sorted({SOURCES.get(s.acceptance_source, s.acceptance_source) for s in summaries if s.acceptance_source})
    return f"; per-request acceptance from {' and '.join(used)}" if used else ""


def headline_table(headline: dict[str, dict], title: str = "headline"):
    """The headline ratios (sweep/summary.py `headline`, as JSON): per comparison, the throughput
    ratio at equal tokens/s/user on the fronts, the highest tokens/s/user of each curve and the
    tokens/s/user ratio at equal concurrency."""
    from rich import box
    from rich.table import Table

    t = Table(title=title, box=box.SIMPLE, pad_edge=False, show_header=False)
    t.add_column("", no_wrap=True)
    t.add_column("", overflow="fold")
    for n, c in enumerate(headline.values()):
        num, den = label(c["num"]), label(c["den"])
        ratios = c["throughput_ratios"]
        if ratios:
            lo, hi = min(r["ratio"] for r in ratios), max(r["ratio"] for r in ratios)
            shown = ratios if len(ratios) <= 4 else [ratios[0], ratios[len(ratios) // 2], ratios[-1]]
            at = ", ".join(f"{r['ratio']:.2f}x at {r['tok_s_user']:.0f}" for r in shown)
            tput = f"{lo:.2f}x-{hi:.2f}x ({at} tok/s/user)"
        else:
            tput = "the fronts reach no tokens/s/user in common"
        best = ", ".join(f"{label(k)} {v:.1f}" for k, v in c["max_tok_s_user"].items() if v is not None)
        eq = ", ".join(f"c={k}: {v:.2f}x" for k, v in c["tok_s_user_ratio_at_equal_label"].items())
        t.add_row(f"{num} / {den} tok/s/GPU at equal tok/s/user", tput)
        t.add_row("highest tok/s/user", best)
        t.add_row(f"{num} / {den} tok/s/user at equal concurrency", eq or "-", end_section=n < len(headline) - 1)
    return t


def tune_table(tune: dict):
    """`sweep --tune`: median output tokens/s of every draft length per level, the best one, and the
    server's own policy against it (with the drafts per round it chose)."""
    from rich import box
    from rich.table import Table

    t = Table(title="draft length per level: median output tok/s", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("conc", justify="right")
    for n in tune["draft_lens"]:
        t.add_column(f"L={n}", justify="right")
    t.add_column("best", justify="right")
    t.add_column(tune["policy"], justify="right")
    t.add_column("/ best", justify="right")
    t.add_column("its drafts/rnd", justify="right")
    med = tune["median_output_tok_s"]
    for c in tune["levels"]:
        c = str(c)
        best = tune["best"][c]
        chosen = [x for x in tune["policy_draft_per_round"][c] if x is not None]
        t.add_row(c, *[f"{med[name][c]:.1f}" for name in _fixed_names(tune)], f"L={best['draft_len']}",
                  f"{med[tune['policy']][c]:.1f}", f"{tune['policy_over_best'].get(c, 0):.3f}",
                  "/".join(f"{x:.1f}" for x in chosen) or "-")
    t.caption = "bands: " + ", ".join(f"up to {b['max_concurrency']}: {b['draft_len']}" for b in tune["bands"])
    return t


def _fixed_names(tune: dict) -> list[str]:
    return [fixed_curve(tune["policy"], n) for n in tune["draft_lens"]]
