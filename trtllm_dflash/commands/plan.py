"""`trtllm-dflash plan RECIPE`: per-rank memory, the largest concurrency that fits, and the smallest
tp that fits on each GPU type. `check` prints the same tables (`print_memory`)."""

from __future__ import annotations

import argparse
import json

from trtllm_dflash.commands.common import add_recipe_argument, gib, make_console


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="per-rank memory plan, the largest concurrency that fits, the smallest tp per GPU")
    add_recipe_argument(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(run=run)


def _table(title: str, columns: tuple[tuple[str, str], ...]):
    """A rich Table with (name, justify) columns."""
    from rich.table import Table

    t = Table(title=title)
    for name, justify in columns:
        t.add_column(name, justify=justify)
    return t


def memory_table(recipe, p):
    """Every row of the plan per rank, where it is allocated, and the need against the GPU."""
    b = recipe.build
    t = _table(f"{recipe.name}: memory per rank ({p.device}, tp={p.tp}, max_batch_size={p.max_batch_size}, "
               f"max_seq_len={b.max_seq_len})",
               (("component", "left"), ("where", "left"), ("GiB", "right"), ("MiB / seq", "right"), ("how", "left")))
    for r in p.rows:
        total = r.bytes * (p.max_batch_size if r.per_sequence else 1)
        t.add_row(r.component, r.where, gib(total), f"{r.bytes / 2**20:,.2f}" if r.per_sequence else "", r.formula)
    f = p.kv_fraction
    if f is not None:
        room = p.kv_pool_bytes / f  # memory - start-up
        t.add_row("KV pool", "", gib(p.kv_pool_bytes), "", f"free_gpu_memory_fraction {f} x (memory - start-up)",
                  style="dim")
        t.add_row("after the pool", "", gib(room - p.kv_pool_bytes), "", f"{1 - f:.1f} x (memory - start-up)",
                  style="dim")
        rule = f"start-up + max(KV pool rows / {f}, after-pool rows / {1 - f:.1f})"
    else:
        rule = "every row (no KV pool: torch allocates on demand)"
    t.add_row("need per rank", "", gib(p.need_bytes), "", rule, style="bold")
    t.add_row("device memory", "", gib(p.capacity_bytes), "", f"{p.device}: {p.capacity_bytes / 1e9:g} GB "
              "(hardware catalog)")
    return t


def tp_table(recipe, fits):
    """The smallest tp that fits each GPU type (`fits`: planner.TpFit per GPU)."""
    q = recipe.quantization
    t = _table(f"smallest tp that fits (target {q.target_weights}, KV {q.kv_cache}, drafter {q.drafter}, "
               f"max_batch_size {recipe.build.max_batch_size}, max_seq_len {recipe.build.max_seq_len})",
               (("GPU", "left"), ("GiB", "right"), ("smallest tp", "right"), ("need GiB / rank", "right"),
                ("note", "left")))
    for fit in fits:
        note = f"memory only: {', '.join(fit.unsupported)} not supported" if fit.unsupported else ""
        if fit.tp is None and fit.tried:
            note = "; ".join(x for x in (f"need at tp {fit.tried[-1]}", note) if x)
        t.add_row(fit.gpu.name, gib(fit.gpu.memory_bytes), fit.describe(),
                  gib(fit.need_bytes) if fit.tried else "", note)
    return t


def print_memory(console, recipe) -> None:
    """The memory table, the verdict, the HBM floor and (GPU recipes) the smallest tp per GPU type."""
    from trtllm_dflash.recipe.plan.planner import gpu_types, plan, smallest_tp

    p = plan(recipe)
    console.print(memory_table(recipe, p))
    verdict = "[green]fits[/green]" if p.fits else "[red]does not fit[/red]"
    console.print(f"{verdict}: {gib(p.need_bytes)} of {gib(p.capacity_bytes)} GiB per rank; max concurrency that "
                  f"fits = [bold]{p.max_concurrency}[/bold] sequences of {recipe.build.max_seq_len} tokens")
    if p.bandwidth_floor_ms is not None:
        console.print(
            f"batch-1 weight read per target step: {gib(p.weights_read_per_step_bytes)} GiB per rank "
            f"-> HBM floor {p.bandwidth_floor_ms:.3f} ms (<= {1e3 / p.bandwidth_floor_ms:,.0f} AR tok/s/user)"
        )
    if not recipe.gpu.is_cpu:
        console.print(tp_table(recipe, [smallest_tp(recipe, g) for g in gpu_types()]))


def plan_json(recipe) -> dict:
    from trtllm_dflash.recipe.hardware import GiB
    from trtllm_dflash.recipe.plan.planner import gpu_types, plan, smallest_tp

    out = plan(recipe).to_json()
    out["smallest_tp"] = [{"gpu": f.gpu.name, "tp": f.tp, "need_gib": round(f.need_bytes / GiB, 4) if f.tried else None,
                           "capacity_gib": round(f.gpu.memory_bytes / GiB, 4), "unsupported": f.unsupported}
                          for f in (smallest_tp(recipe, g) for g in gpu_types())]
    out["verify"] = verify_line(recipe)
    return out


def verify_line(recipe) -> str:
    """What a verify round costs the target (recipe/plan/engine_layout.py verify_cost), as check,
    build --dry-run and project say it."""
    from trtllm_dflash.recipe.plan.engine_layout import verify_cost

    return verify_cost(recipe).describe()


def run(args: argparse.Namespace) -> int:
    from trtllm_dflash.recipe import check, load_recipe
    from trtllm_dflash.recipe.load import error_lines

    # A plan is most useful when it does not fit, so memory is not a load-time rule here.
    recipe = load_recipe(args.recipe, args.overrides, check_rules=False, planning=True)
    errors = [i for i in check(recipe, memory=False) if i.level == "error"]
    if errors:
        raise error_lines(recipe, errors)
    if args.json:
        print(json.dumps(plan_json(recipe), indent=2))
        return 0
    console = make_console()
    print_memory(console, recipe)
    console.print(verify_line(recipe))
    if not recipe.gpu.is_cpu:
        from trtllm_dflash.recipe.plan.placement import scale_out
        from trtllm_dflash.recipe.plan.planner import smallest_tp

        console.print("layout: " + scale_out(recipe, smallest_tp(recipe, recipe.gpu).tp))
    return 0
