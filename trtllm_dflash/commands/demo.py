"""`trtllm-dflash demo [RECIPE]`: the main job. `run` on a recipe (default: the embedded CPU
recipe) plus a summary: check notes and the memory plan first, then every stage that runs on
this machine (convert, quantize when the recipe quantizes, deploy, serve on free loopback
ports, sweep: AR beside DFlash, and DDTree when the recipe has a budget, from the same server and
prompts), then the sweep table and the headline ratios (DFlash's throughput over AR's at equal
tokens/s/user on the Pareto fronts, the highest tokens/s/user of each, tokens/s/user ratios at
equal concurrency). Stages that are current are skipped; the tables are shown either way."""

from __future__ import annotations

import argparse

from trtllm_dflash.commands.common import add_recipe_argument, make_console
from trtllm_dflash.commands.run import add_pipeline_arguments


def register(sub: argparse._SubParsersAction) -> None:
    # The same arguments as `run` (add_pipeline_arguments); only the summary differs.
    p = sub.add_parser("demo", help="run a recipe end to end and print the summary (default: the CPU recipe)")
    add_recipe_argument(p)
    add_pipeline_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trtllm_dflash.commands.run import run_pipeline
    from trtllm_dflash.commands.sweep import print_summary
    from trtllm_dflash.recipe import check, load_recipe
    from trtllm_dflash.recipe.plan.planner import plan
    from trtllm_dflash.sweep.stage import read_summary
    from trtllm_dflash.sweep.summary import read_headline

    console = make_console(highlight=False)
    recipe = load_recipe(args.recipe, args.overrides)
    console.rule(f"[bold]{recipe.name}[/bold]: check and plan")
    for issue in check(recipe):
        console.print(f"note: {issue.field}: {issue.message}", markup=False)
    p = plan(recipe)
    console.print(f"{p.need_gib:.2f} GiB needed of {p.capacity_gib:.1f} GiB per rank at max_batch_size "
                  f"{p.max_batch_size}; max concurrency that fits: {p.max_concurrency}")
    console.rule("[bold]pipeline")
    rc, out, stages = run_pipeline(args, console)
    if rc or (args.until and args.until != "sweep"):
        return rc
    console.rule("[bold]summary")
    print_summary(console, {"headline": read_headline(out / "sweep")}, read_summary(out / "sweep"),
                  f"{recipe.name}: concurrency sweep")
    ran = [s.stage for s in stages if s.status == "ran"]
    console.print(f"stages run: {', '.join(ran) or 'none (all up to date)'}; outputs in {out}/: "
                  "sweep/ has results.jsonl, summary.csv, summary.json, sweep.png")
    return 0
