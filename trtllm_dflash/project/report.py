"""Projection reports: rich tables, the JSON/CSV files and the plot (tokens/s/GPU against
tokens/s/user, every curve with its Pareto front, a measured sweep overlaid)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from trtllm_dflash.errors import UserError
from trtllm_dflash.project.projection import (
    AR,
    BANDS,
    BEST,
    Projection,
    dflash_name,
)
from trtllm_dflash.recipe.support import backend as backend_spec
from trtllm_dflash.sweep.fronts import front
from trtllm_dflash.sweep.metrics import LevelSummary, curve_of
from trtllm_dflash.sweep.summary import SUMMARY, read_curves


def read_measured(directory: Path) -> dict[str, list[LevelSummary]]:
    """The level summaries of a sweep output directory, by curve (a sweep that measured one
    curve has the key ""): sweep/summary.py read_curves, with one-line errors for --measured."""
    path = Path(directory) / SUMMARY
    if not path.is_file():
        raise UserError(f"--measured {directory}: no {SUMMARY} (expected a sweep output directory)")
    try:
        curves = {name or "": rows for name, rows in read_curves(directory).items()}
    except (json.JSONDecodeError, TypeError, KeyError, AttributeError) as e:
        raise UserError(f"--measured {path}: not a sweep summary ({type(e).__name__}: {e})") from None
    if not curves:
        raise UserError(f"--measured {path}: no levels")
    return curves


def served_curve(recipe) -> tuple[str, str]:
    """The projected curve a sweep of this recipe measures, and a note about it."""
    if recipe.speculative.auto:
        note = ("speculative.draft_len auto: modelled as the best draft length per level (0 included), what it "
                "aims for from live acceptance")
    elif recipe.speculative.bands:
        note = "the server applies speculative.draft_len per concurrency band"
    else:
        note = "no speculative.draft_len bands: the server drafts block_size - 1 tokens at every concurrency"
    if backend_spec(recipe.backend.name).ddtree and recipe.speculative.ddtree_budget:
        note += "; it decodes DDTree (speculative.ddtree_budget is set), which the projection does not model"
    return BANDS, note


def projected_counterpart(recipe, measured_curve: str) -> str | None:
    """The projected curve a measured curve compares with: "ar" -> AR, the server's own decoding
    ("" or "dflash") -> served_curve, "dflash L=K" -> DFlash K=K; None for others (DDTree)."""
    name = measured_curve.strip().lower()
    if name == "ar":
        return AR
    if name in ("", "dflash"):
        return served_curve(recipe)[0]
    if name.startswith("dflash l="):
        try:
            return dflash_name(int(name.split("=", 1)[1]))
        except ValueError:
            return None
    return None


def compare_measured(proj: Projection, recipe, measured: dict[str, list[LevelSummary]]) -> list[dict]:
    """measured_vs_projected for every measured curve with a projected counterpart."""
    out = []
    for name, rows in measured.items():
        target = projected_counterpart(recipe, name)
        if target in proj.curves:
            out += [{"measured_curve": name or "dflash", "projected_curve": target, **r}
                    for r in measured_vs_projected(proj, rows, target)]
    return out


def pooled_tok_s_user(m: LevelSummary) -> float | None:
    """tokens/s/user of all a level's requests together: 1 / mean TPOT (equal-length requests)."""
    return 1 / m.tpot_s.mean if m.tpot_s and m.tpot_s.mean else None


def _at_tau(error: float | None, measured_tau: float | None, projected_tau: float | None) -> float | None:
    """A projection's relative error had it run at the measured tau (measured_vs_projected)."""
    if error is None or not measured_tau or not projected_tau:
        return None
    return (1 + error) * measured_tau / projected_tau - 1


def measured_vs_projected(proj: Projection, measured: list[LevelSummary], curve: str) -> list[dict]:
    """Per concurrency both have: measured and projected tokens/s/user and tokens/s/GPU, relative
    errors. The projection has one tau for every request, so its tokens/s/user is the pooled rate
    (1 / mean TPOT); the median request's rate (the sweep's p50, plotted) moves with the spread of
    per-request tau as well, and is reported beside it.

    The errors at the measured tau take the acceptance out, leaving the timing model: a round's
    cost barely moves with the drafts it accepts (the verify pass covers every drafted slot), so a
    rate scales with tau, and the projection at the level's own tau is the projected rate times
    measured tau / projected tau."""
    rows = {r.concurrency: r for r in proj.curves[curve]}
    out = []
    for m in measured:
        p = rows.get(m.concurrency)
        pooled = pooled_tok_s_user(m)
        if p is None or pooled is None:
            continue
        pu = p.tok_s_user.p50
        user_error = pu / pooled - 1
        gpu_error = p.output_tok_s_per_gpu / m.output_tok_s_per_gpu - 1 if m.output_tok_s_per_gpu else None
        out.append({"concurrency": m.concurrency, "measured_tok_s_user": pooled, "projected_tok_s_user": pu,
                    "tok_s_user_error": user_error,
                    "measured_tok_s_user_p50": m.tok_s_user.p50 if m.tok_s_user else None,
                    "measured_tok_s_gpu": m.output_tok_s_per_gpu, "projected_tok_s_gpu": p.output_tok_s_per_gpu,
                    "tok_s_gpu_error": gpu_error, "measured_tau": m.tau, "projected_tau": p.tau,
                    "tok_s_user_error_at_measured_tau": _at_tau(user_error, m.tau, p.tau),
                    "tok_s_gpu_error_at_measured_tau": _at_tau(gpu_error, m.tau, p.tau)})
    return out


def levels_table(proj: Projection):
    from rich import box
    from rich.table import Table

    t = Table(title=f"{proj.recipe}: projected on {proj.device} (prompt {proj.input_len}, output {proj.output_len} "
                    "tokens)")
    # Short two-line headers (units in the caption), whole tokens/s and no vertical rules: the table
    # fits a 100-column terminal, and a log (commands/common.py make_console).
    t.box = box.SIMPLE_HEAD
    for col in ("conc", "AR\nuser", "AR\nGPU", "bands\nK", "bands\ntau", "bands\nuser", "bands\nGPU", "step\nms",
                "x AR\nsame c", "best\nK", "best\nuser", "best\nGPU"):
        t.add_column(col, justify="right")
    ar, bands, best = proj.curves[AR], proj.curves[BANDS], proj.curves[BEST]
    for i, c in enumerate(proj.levels):
        a, b, s = ar[i], bands[i], best[i]
        t.add_row(str(c), f"{a.tok_s_user.p50:,.0f}", f"{a.output_tok_s_per_gpu:,.0f}", str(proj.draft_lens[BANDS][i]),
                  f"{b.tau:.2f}", f"{b.tok_s_user.p50:,.0f}", f"{b.output_tok_s_per_gpu:,.0f}",
                  f"{b.inter_chunk_s.p50 * 1e3:.2f}", f"{b.tok_s_user.p50 / a.tok_s_user.p50:.2f}",
                  str(proj.draft_lens[BEST][i]), f"{s.tok_s_user.p50:,.0f}", f"{s.output_tok_s_per_gpu:,.0f}")
    skipped = "; ".join(f"c={c}: {why}" for c, why in proj.skipped.items())
    t.caption = ("user, GPU: output tokens/s per user and per GPU; bands: the recipe's speculative.draft_len; best: "
                 "the best draft length per level; step ms: one round\n"
                 f"acceptance: {proj.acceptance.source}" + (f"\nleft out: {skipped}" if skipped else "")
                 + f"\nsuggested speculative.draft_len: {proj.suggested_bands}")
    return t


def headline_table(proj: Projection):
    from rich.table import Table

    t = Table(title="headline ratios (DFlash / AR)")
    for col in ("DFlash curve", "highest tok/s/user DFlash / AR", "throughput x AR at equal tok/s/user",
                "x AR at 500-600 tok/s/user", "tok/s/user x AR at equal concurrency"):
        t.add_column(col, justify="right")
    for c in proj.comparisons.values():
        num_max, den_max = c.max_user_rate[c.num], c.max_user_rate[c.den]
        rs = [r for _, r in c.throughput_ratios]
        eq = list(c.user_rate_ratios.values())
        band = next(iter(c.bands.values()), None)
        t.add_row(c.num, f"{num_max:,.0f} / {den_max:,.0f}",
                  f"{min(rs):.1f}-{max(rs):.1f} over {c.overlap[0]:,.0f}-{c.overlap[1]:,.0f}" if rs
                  else "fronts do not overlap",
                  f"{band[0]:.1f}-{band[1]:.1f}" if band else "not reached by both",
                  f"{min(eq):.2f}-{max(eq):.2f}" if eq else "-")
    return t


def comparison_table(rows: list[dict]):
    from rich.table import Table

    t = Table(title="measured sweep vs projection")
    for col in ("curve", "conc", "measured tok/s/user (pooled)", "projected", "error", "measured p50",
                "measured tok/s/GPU",
                "projected", "error", "measured tau", "projected tau"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(f"{r['measured_curve']} / {r['projected_curve']}", str(r["concurrency"]),
                  f"{r['measured_tok_s_user']:,.1f}", f"{r['projected_tok_s_user']:,.1f}",
                  f"{100 * r['tok_s_user_error']:+.0f}%",
                  f"{r['measured_tok_s_user_p50']:,.1f}" if r["measured_tok_s_user_p50"] else "-",
                  f"{r['measured_tok_s_gpu']:,.1f}",
                  f"{r['projected_tok_s_gpu']:,.1f}",
                  f"{100 * r['tok_s_gpu_error']:+.0f}%" if r["tok_s_gpu_error"] is not None else "-",
                  f"{r['measured_tau']:.2f}" if r["measured_tau"] else "-", f"{r['projected_tau']:.2f}")
    return t


def write_files(proj: Projection, out: Path, measured: dict[str, list[LevelSummary]] | None = None,
                comparison: list[dict] | None = None, measured_label: str = "measured") -> dict[str, Path]:
    """projection.json, projection.csv (one row per curve and level), projection.png."""
    out.mkdir(parents=True, exist_ok=True)
    data = proj.to_json()
    if measured is not None:
        from dataclasses import asdict

        data["measured"] = {"label": measured_label,
                            "curves": {name: [asdict(m) for m in rows] for name, rows in measured.items()},
                            "vs_projection": comparison or []}
    paths = {"json": out / "projection.json", "csv": out / "projection.csv", "png": out / "projection.png"}
    paths["json"].write_text(json.dumps(data, indent=2))
    with open(paths["csv"], "w", newline="") as f:
        rows = [{"curve": name, "draft_len": k,
                 **{c: v for c, v in r.flat().items() if c not in ("curve", "draft_len")}}
                for name, levels in proj.curves.items() for r, k in zip(levels, proj.draft_lens[name])]
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plot(proj, paths["png"], measured, measured_label)
    return paths


def plot(proj: Projection, path: Path, measured: dict[str, list[LevelSummary]] | None = None,
         measured_label: str = "measured", draft_lens: list[int] | None = None) -> Path:
    """tokens/s/GPU against tokens/s/user: AR, DFlash at a few draft lengths, the recipe's bands
    (annotated with the concurrency), the best draft length, the AR and DFlash Pareto fronts, a
    measured sweep on top. Log-scaled throughput when it spans more than 20x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k_all = sorted(int(n.split("=")[1]) for n in proj.curves if n.startswith("DFlash K="))
    if draft_lens is None:  # the band lengths, the longest, and one short one
        draft_lens = sorted({*proj.draft_lens[BANDS], k_all[-1], min(3, k_all[-1])} & set(k_all))
    fig, ax = plt.subplots(figsize=(7.2, 4.8), dpi=110)
    shades = plt.cm.Blues([0.35 + 0.6 * i / max(1, len(draft_lens) - 1) for i in range(len(draft_lens))])
    for k, color in zip(draft_lens, shades):
        pts = proj.curve(dflash_name(k)).points
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", color=color, linewidth=1, alpha=0.8,
                label=f"DFlash K={k} (tau {proj.acceptance.tau(k):.2f})")
    for name, style, color, width in ((AR, "o-", "#555555", 1.8), (BANDS, "o-", "#76b900", 2.4),
                                      (BEST, "s--", "#2f6b00", 1.2)):
        pts = proj.curve(name).points
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, linewidth=width, markersize=4, label=name)
    for c, (x, y) in zip(proj.levels, proj.curve(BANDS).points):
        ax.annotate(f"c={c}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color="#3b5e00")
    every_dfl = [p for k in k_all for p in proj.curve(dflash_name(k)).points]
    for pts, label in ((proj.curve(AR).points, "AR front"), (every_dfl, "DFlash front (all draft lengths)")):
        f = front(pts)
        ax.plot([p[0] for p in f], [p[1] for p in f], ":", color="black", linewidth=1,
                label=label if label.startswith("DFlash") else None)
    for (name, rows), color in zip((measured or {}).items(), ("#d62728", "#ff7f0e", "#9467bd", "#8c564b")):
        m = curve_of(name, rows)
        ax.plot([p[0] for p in m.points], [p[1] for p in m.points], "D-", color=color, markersize=5,
                linewidth=1.5, label=f"{measured_label}{': ' + name if name else ''}")
    ys = [p[1] for name in proj.curves for p in proj.curve(name).points if p[1] > 0]
    if ys and max(ys) / min(ys) > 20:
        ax.set_yscale("log")
    xs_max = max(p[0] for name in proj.curves for p in proj.curve(name).points)
    if xs_max > 600:
        ax.axvspan(500, 600, color="#fff3b0", alpha=0.6, zorder=0, label="500-600 tok/s/user")
    ax.set_xlabel("tokens/s/user (= 1/TPOT)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title(f"{proj.recipe}: projection ({proj.device})", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
