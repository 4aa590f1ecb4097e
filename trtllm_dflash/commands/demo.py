"""`trtllm-dflash demo [RECIPE]`: the main job. Takes a recipe (default: the embedded CPU
recipe) through every stage that runs on this machine: check, plan, deploy, serve (a real
tritonserver on free loopback ports) and a concurrency sweep; prints a summary table,
writes results and the plot, and stops the server."""

from __future__ import annotations

import argparse
from pathlib import Path

from trtllm_dflash.commands.common import add_recipe_argument


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="check, plan, deploy, serve and sweep a recipe end to end (default: the CPU recipe)")
    add_recipe_argument(p)
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="output directory (default runs/demo)")
    p.add_argument("--levels", default=None, help="comma-separated concurrency levels (default: the recipe's)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import shutil

    from rich.console import Console

    from trtllm_dflash.commands.sweep import parse_levels
    from trtllm_dflash.deploy.repository import REPOSITORY, deploy
    from trtllm_dflash.errors import UserError
    from trtllm_dflash.sweep.report import summary_table
    from trtllm_dflash.prompts.sources import load_prompts
    from trtllm_dflash.sweep.loadgen import run_sweep
    from trtllm_dflash.recipe.planner import plan
    from trtllm_dflash.recipe import check, load_recipe
    from trtllm_dflash.serve.launch import Endpoints, TritonServer, free_port

    console = Console()
    recipe = load_recipe(args.recipe, args.overrides)
    if recipe.backend.name != "reference":
        raise UserError(
            f"demo runs the reference backend on this machine; {recipe.name} uses the {recipe.backend.name} "
            "backend (GPU): run check, plan, convert, quantize and deploy, then serve --run in NVIDIA's container"
        )
    missing = [f"{w}.source {getattr(recipe, w).source}" for w in ("target", "drafter")
               if getattr(recipe, w).path is None or not getattr(recipe, w).path.exists()]
    if missing:
        raise UserError(f"demo needs local weights: {', '.join(missing)} not found")
    console.rule(f"[bold]1/5 check[/bold] {recipe.name}")
    for issue in check(recipe):
        console.print(f"note: {issue.field}: {issue.message}")
    console.print("ok")
    console.rule("[bold]2/5 plan")
    p = plan(recipe)
    console.print(f"{p.total_gib:.2f} GiB of {p.capacity_gib:.1f} GiB at max_batch_size {p.max_batch_size}; "
                  f"max concurrency that fits: {p.max_concurrency}")
    console.rule("[bold]3/5 deploy")
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out / "deploy", ignore_errors=True)
    repo = deploy(recipe, out / "deploy")
    console.print(f"model repository: {repo / REPOSITORY}")
    console.rule("[bold]4/5 serve")
    endpoints = Endpoints("127.0.0.1", free_port(), free_port(), free_port())
    sw = recipe.sweep
    levels = parse_levels(args.levels, sw.concurrency)
    with TritonServer(repo / REPOSITORY, endpoints):
        console.print(f"tritonserver ready: http://{endpoints.http_url} grpc {endpoints.grpc_url}")
        console.rule("[bold]5/5 sweep")
        prompts = load_prompts(sw.dataset, max(sw.requests_at(c) for c in levels) + sw.warmup_requests,
                               sw.input_len, sw.seed)
        result = run_sweep(endpoints.grpc_url, recipe.serve.model_name, levels, sw.requests_at, sw.warmup_requests,
                           prompts, sw.output_len, gpus=1, out_dir=out / "sweep", seed=sw.seed,
                           title=f"{recipe.name} (reference backend, CPU)")
    console.print(summary_table(result.levels, f"{recipe.name}: concurrency sweep"))
    console.print(f"wrote {out / 'sweep'}: results.jsonl, summary.csv, summary.json, sweep.png; server stopped")
    failed = sum(s.failed for s in result.levels)
    if failed:
        console.print(f"[red]{failed} requests failed[/red]")
    return 1 if failed else 0
