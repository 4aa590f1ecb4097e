"""`trtllm-dflash plan RECIPE`: per-device memory and the largest concurrency that fits."""

from __future__ import annotations

import argparse
import json

from trtllm_dflash.commands.common import add_recipe_argument, gib, make_console


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="per-device memory plan and the largest concurrency that fits")
    add_recipe_argument(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from trtllm_dflash.recipe.planner import plan
    from trtllm_dflash.recipe import load_recipe

    # A plan is most useful when it does not fit, so memory is not a load-time rule here.
    recipe = load_recipe(args.recipe, args.overrides, check_rules=False)
    from trtllm_dflash.recipe import check

    errors = [i for i in check(recipe) if i.level == "error" and i.field != "build.max_batch_size"]
    if errors:
        from trtllm_dflash.recipe import RecipeError

        file = args.recipe or "(default recipe)"
        raise RecipeError("\n".join(f"{file}: {i.field}: {i.message}" for i in errors))
    p = plan(recipe)
    if args.json:
        print(json.dumps(p.to_json(), indent=2))
        return 0

    t = Table(title=f"{recipe.name}: memory per device ({p.device}, tp={p.tp}, max_batch_size={p.max_batch_size})")
    t.add_column("component")
    t.add_column("GiB", justify="right")
    t.add_column("MiB / seq", justify="right")
    t.add_column("how")
    for r in p.rows:
        total = r.bytes * (p.max_batch_size if r.per_sequence else 1)
        per_seq = f"{r.bytes / 2**20:,.2f}" if r.per_sequence else ""
        t.add_row(r.component, gib(total), per_seq, r.formula)
    t.add_row("total at max_batch_size", gib(p.total_bytes), f"{p.per_sequence_bytes / 2**20:,.2f}", "fixed + max_batch_size x per sequence", style="bold")
    t.add_row("capacity", gib(p.capacity_bytes), "", "device memory x 0.95")
    console = make_console()
    console.print(t)
    verdict = "[green]fits[/green]" if p.fits else "[red]does not fit[/red]"
    console.print(f"{verdict}: max concurrency that fits = [bold]{p.max_concurrency}[/bold] sequences of {recipe.build.max_seq_len} tokens")
    if p.bandwidth_floor_ms is not None:
        console.print(
            f"batch-1 weight read per target step: {gib(p.weights_read_per_step_bytes)} GiB per device "
            f"-> HBM floor {p.bandwidth_floor_ms:.3f} ms (<= {1e3 / p.bandwidth_floor_ms:,.0f} AR tok/s/user)"
        )
    return 0
