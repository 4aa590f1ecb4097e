"""Sweep reports: a rich table and the throughput-vs-interactivity plot with its Pareto front."""

from __future__ import annotations

from pathlib import Path

from trtllm_dflash.sweep.fronts import pareto_front
from trtllm_dflash.sweep.metrics import LevelSummary


def _points(summaries: list[LevelSummary]) -> list[tuple[float, float]]:
    """(median tokens/s/user, output tokens/s/GPU) per level."""
    return [((s.tok_s_user.p50 if s.tok_s_user else 0.0), s.output_tok_s_per_gpu) for s in summaries]


def plot_pareto(summaries: list[LevelSummary], path: Path, title: str = "", label: str = "DFlash") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = _points(summaries)
    front = pareto_front(pts)
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color="#76b900", label=label, zorder=2)
    for s, (x, y) in zip(summaries, pts):
        ax.annotate(f"c={s.concurrency}", (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    fx = sorted((pts[i] for i in front), key=lambda p: p[0])
    ax.plot([p[0] for p in fx], [p[1] for p in fx], "--", color="black", linewidth=1, label="Pareto front", zorder=1)
    ax.scatter([p[0] for p in fx], [p[1] for p in fx], s=90, facecolors="none", edgecolors="black", zorder=3)
    ax.set_xlabel("tokens/s/user (median, = 1/TPOT)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title(title or "throughput vs interactivity")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def summary_table(summaries: list[LevelSummary], title: str = "sweep"):
    from rich.table import Table

    t = Table(title=title)
    for col in ("conc", "reqs", "fail", "tok/s/GPU", "tok/s/user p50", "TTFT p50 ms", "TTFT p99 ms",
                "TPOT p50 ms", "chunk gap p50 ms", "tau"):
        t.add_column(col, justify="right")
    front = set(pareto_front(_points(summaries)))
    for i, s in enumerate(summaries):
        ms = lambda d, stat: f"{getattr(d, stat) * 1e3:.1f}" if d else "-"  # noqa: E731
        t.add_row(
            str(s.concurrency) + (" *" if i in front else ""), str(s.requests), str(s.failed),
            f"{s.output_tok_s_per_gpu:.1f}", f"{s.tok_s_user.p50:.1f}" if s.tok_s_user else "-",
            ms(s.ttft_s, "p50"), ms(s.ttft_s, "p99"), ms(s.tpot_s, "p50"), ms(s.inter_chunk_s, "p50"),
            f"{s.tau:.2f}" if s.tau else "unknown",  # the server reported no verify passes
        )
    t.caption = "* on the Pareto front (tokens/s/GPU vs tokens/s/user)"
    return t
