"""Draft-length policies on the served path: the goal of the draft-length issue, measured.

    trtllm-dflash bench policy [RECIPE] [--levels 1,2,4,8,16] [--repeats 3] [--fixed 1,3,7,15]
        [--set KEY=VALUE ...] [--work DIR] [--json]

Deploys RECIPE (default: the embedded CPU recipe) as `run --until deploy` does, serves it with
tritonserver and sweeps that one server, level by level, repeat by repeat, curve by curve (so
the drift of a shared machine falls on every curve alike), with the recipe's sweep workload
(prompts, output lengths: `sweep.output_len_range`). Curves:

  ar            plain decoding (every request `mode: ar`)
  dflash L=n    a fixed draft length per request, n in --fixed (default 1, 3, 7, 15)
  dflash        the deployment's own policy (`speculative.draft_len`: auto, bands or fixed)
  ddtree        the deployment's DDTree (when it has a `ddtree_budget`), under the same policy

Per level and curve the figure is tokens/s/user p50 (the sweep's), the median over repeats.
Printed as ratios, the goals: dflash >= 0.97x max(ar, best fixed) at every level, >= 1.0x ar at
c = 8 and 16, >= 1.5x ar at c = 1; ddtree >= 1.0x ar at c = 8 and 16; plus the share of
requests' rounds the server ran without drafts (its /metrics). Beside the goal's ratio: its range
over the repeats (each repeat's dflash p50 over that repeat's max(ar, best fixed): how far one
repeat's reading moves) and the same ratio of the mean tokens/s/user (`auto` maximises the
batch's tokens per second, which raises the mean user's rate more than the median's:
docs/design/draft-length-history.md, "What the p50 measures"). With --json the last stdout line is one JSON object.
"""

from __future__ import annotations

import statistics
from pathlib import Path

FIXED = (1, 3, 7, 15)


def curves(recipe, fixed=FIXED):
    from trtllm_dflash.sweep.loadgen import Variant

    out = [Variant("ar", "ar")] + [Variant(f"dflash L={n}", "dflash", n) for n in fixed]
    out.append(Variant("dflash", "dflash"))
    if recipe.speculative.ddtree_budget:
        out.append(Variant("ddtree", "ddtree"))
    return out


def bench(recipe, work: Path, levels=(1, 2, 4, 8, 16), repeats: int = 3, fixed=FIXED, say=print) -> dict:
    from trtllm_dflash import pipeline
    from trtllm_dflash.deploy.settings import REPOSITORY
    from trtllm_dflash.launch.server import Endpoints, TritonServer
    from trtllm_dflash.prompts.sources import load_prompts
    from trtllm_dflash.sweep.loadgen import run_sweep

    pipeline.run(recipe, work, until="deploy", progress=False, say=say)
    sw = recipe.sweep
    prompts = load_prompts(sw.dataset, max(sw.requests_at(c) for c in levels) + sw.warmup_requests, sw.input_len,
                           sw.seed)
    variants = curves(recipe, fixed)
    endpoints = Endpoints.free()
    with TritonServer(Path(work) / "deploy" / REPOSITORY, endpoints):
        result = run_sweep(endpoints.grpc_url, recipe.serve.model_name, list(levels), sw.requests_at,
                           sw.warmup_requests, prompts, sw.output_lens(len(prompts)), gpus=1, seed=sw.seed,
                           variants=variants, repeats=repeats,
                           metrics_url=f"http://{endpoints.host}:{endpoints.metrics_port}/metrics")
    failed = result.failed
    rows = []
    for c in levels:
        runs = {v.name: result.repeats[(v.name, c)] for v in variants}
        p50 = {name: statistics.median(r.tok_s_user.p50 for r in rs) for name, rs in runs.items()}
        mean = {name: statistics.median(r.tok_s_user.mean for r in rs) for name, rs in runs.items()}
        lens: dict[str, float] = {}
        for r in runs["dflash"]:
            for k, n in (r.server_draft_lens or {}).items():
                lens[k] = lens.get(k, 0.0) + n
        best = max((f"dflash L={n}" for n in fixed), key=lambda name: p50[name])
        baselines = ["ar", *(f"dflash L={n}" for n in fixed)]  # the goal's max(ar, best fixed)
        bar = max(p50[n] for n in baselines)
        row = {"concurrency": c, "tok_s_user_p50": p50, "best_fixed": best,
               "dflash_over_ar": p50["dflash"] / p50["ar"], "dflash_over_best": p50["dflash"] / bar,
               "dflash_over_best_repeats": repeat_ratios(runs, baselines),
               "tok_s_user_mean": mean,
               "dflash_over_best_mean": mean["dflash"] / max(mean[n] for n in baselines),
               "dflash_zero_share": lens.get("0", 0.0) / sum(lens.values()) if lens else None,
               "dflash_draft_lens": dict(sorted(lens.items(), key=lambda kv: int(kv[0])))}
        if "ddtree" in p50:
            row["ddtree_over_ar"] = p50["ddtree"] / p50["ar"]
        rows.append(row)
    spec = recipe.speculative
    return {"recipe": recipe.name, "levels": rows, "failed": failed,
            "settings": {"repeats": repeats, "fixed": list(fixed), "draft_len": spec.draft_len,
                         "ddtree_budget": spec.ddtree_budget, "output_len": sw.output_len,
                         "output_len_range": sw.output_len_range, "input_len": sw.input_len}}


def repeat_ratios(runs: dict[str, list], against: list[str]) -> list[float]:
    """Each repeat's dflash p50 over the best p50 of the `against` curves in that same repeat:
    how far one repeat's reading of the goal's ratio moves. (Each repeat's best of several noisy
    curves is its luckiest, so these sit a little below the ratio of the medians.)"""
    return [d.tok_s_user.p50 / max(r.tok_s_user.p50 for r in others)
            for d, *others in zip(runs["dflash"], *(runs[n] for n in against))]


def goals(result: dict) -> list[str]:
    """The issue's bars this run missed, one line each (empty: all met)."""
    missed = []
    for r in result["levels"]:
        c = r["concurrency"]
        if r["dflash_over_best"] < 0.97:
            missed.append(f"c={c}: dflash {r['dflash_over_best']:.3f}x max(ar, best fixed) < 0.97")
        if c >= 8 and r["dflash_over_ar"] < 1.0:
            missed.append(f"c={c}: dflash {r['dflash_over_ar']:.2f}x ar < 1.0")
        if c == 1 and r["dflash_over_ar"] < 1.5:
            missed.append(f"c=1: dflash {r['dflash_over_ar']:.2f}x ar < 1.5")
        if c >= 8 and r.get("ddtree_over_ar", 1.0) < 1.0:
            missed.append(f"c={c}: ddtree {r['ddtree_over_ar']:.2f}x ar < 1.0")
    return missed


def rows(result: dict) -> tuple[list[str], list[list[str]]]:
    """The result as (header, rows of cells): what `table` prints and `markdown` writes."""
    has_tree = "ddtree_over_ar" in result["levels"][0]
    head = ["c", "AR", "best fixed", "dflash", "dflash/AR", "dflash/max(AR,fixed)", "per repeat", "mean: dflash/max",
            "no-draft share", *(("ddtree", "ddtree/AR") if has_tree else ())]
    out = []
    for r in result["levels"]:
        m = r["tok_s_user_p50"]
        zero = "-" if r["dflash_zero_share"] is None else f"{r['dflash_zero_share']:.0%}"
        each = r.get("dflash_over_best_repeats")
        spread = f"{min(each):.3f}-{max(each):.3f}" if each else "-"
        on_mean = f"{r['dflash_over_best_mean']:.3f}" if "dflash_over_best_mean" in r else "-"
        out.append([str(r["concurrency"]), f"{m['ar']:.1f}", f"{m[r['best_fixed']]:.1f} ({r['best_fixed'][7:]})",
                    f"{m['dflash']:.1f}", f"{r['dflash_over_ar']:.2f}x", f"{r['dflash_over_best']:.3f}", spread,
                    on_mean, zero,
                    *((f"{m['ddtree']:.1f}", f"{r['ddtree_over_ar']:.2f}x") if has_tree else ())])
    return head, out


def markdown(result: dict) -> str:
    """The result as a Markdown table (the served-policy block of docs/design/draft-length-history.md)."""
    from trtllm_dflash.perf.report import markdown_table

    return markdown_table(*rows(result))


def table(result: dict) -> None:
    from trtllm_dflash.perf.report import print_table

    s = result["settings"]
    print_table(f"{result['recipe']}: tokens/s/user p50 served (median of {s['repeats']} repeats; output "
                f"{s['output_len']} +- {s['output_len_range']:.0%})", *rows(result))
    missed = goals(result)
    print("goals: all met" if not missed else "goals missed:\n  " + "\n  ".join(missed))
