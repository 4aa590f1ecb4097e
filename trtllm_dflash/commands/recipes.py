"""`trtllm-dflash recipes`: list the shipped recipes (with --models, --hardware, --support: the model
catalog, the hardware catalog, what runs where)."""

from __future__ import annotations

import argparse
import json

from trtllm_dflash.commands.common import make_console


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("recipes", help="list the shipped recipes and the model / hardware catalogs")
    p.add_argument("--models", action="store_true", help="list the model catalog instead")
    p.add_argument("--hardware", action="store_true", help="list the hardware catalog instead")
    p.add_argument("--support", action="store_true", help="what runs where: every (target architecture, drafter, "
                   "backend) with its GPUs and precisions (recipe/support.py)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def _catalog(console, as_json: bool, title: str, cat: dict, columns: tuple[str, ...], row) -> int:
    """Print a catalog as JSON or as a table with `row(name, entry)` per entry."""
    from rich.table import Table

    if as_json:
        print(json.dumps({k: v.model_dump() for k, v in cat.items()}, indent=2))
        return 0
    t = Table(title=title)
    for col in columns:
        t.add_column(col)
    for name, entry in cat.items():
        t.add_row(*row(name, entry))
    console.print(t)
    return 0


def _support(console, as_json: bool) -> int:
    from dataclasses import asdict

    from rich.table import Table

    from trtllm_dflash.recipe.support import support_rows, where_it_runs

    rows = support_rows()
    if as_json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return 0
    t = Table(title="support: target architecture x drafter x backend")
    for col in ("target", "drafter", "backend", "GPUs: target weight precisions", "notes"):
        t.add_column(col)
    for r in rows:
        t.add_row(r.target, r.drafter, r.backend, where_it_runs(r), r.why_not
                  or (f"cpu: {r.cpu_note}" if r.cpu_note else ""))
    console.print(t)
    return 0


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from trtllm_dflash.recipe import list_recipes, load_recipe, recipes_root
    from trtllm_dflash.recipe.hardware import hardware_catalog
    from trtllm_dflash.recipe.models import model_catalog

    console = make_console()
    if args.support:
        return _support(console, args.json)
    if args.models:
        return _catalog(console, args.json, "model catalog", model_catalog(),
                        ("name", "source", "family", "layers", "hidden", "heads/kv", "params"),
                        lambda name, e: (name, e.hf_id, e.family, str(e.num_layers), str(e.hidden_size),
                                         f"{e.num_attention_heads}/{e.num_kv_heads}", f"{e.total_params / 1e9:.3f}B"))
    if args.hardware:
        def rates(g) -> str:
            return "/".join("-" if x is None else f"{x:g}" for x in (g.bf16_tflops, g.fp8_tflops, g.fp4_tflops))

        return _catalog(console, args.json, "hardware catalog", hardware_catalog(),
                        ("name", "SM", "memory GB", "HBM TB/s", "BF16/FP8/FP4 TFLOPS", "formats"),
                        lambda name, g: (name, str(g.sm or "-"), f"{g.memory_gb:g}", str(g.hbm_bandwidth_tbs or "-"),
                                         rates(g), ", ".join(g.formats)))

    rows = []
    for path in list_recipes():
        r = load_recipe(path, check_rules=False, planning=True)
        rows.append(dict(
            recipe=str(path.relative_to(recipes_root())), path=str(path), name=r.name,
            hardware=f"{r.hardware.count}x {r.hardware.gpu}",
            target=r.target.source, drafter=r.drafter.source, weights=r.quantization.target_weights,
            tp=r.parallel.tp, backend=r.backend.name,
        ))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    t = Table(title="recipes")
    for col in ("name", "hardware", "target", "weights", "tp", "backend"):
        t.add_column(col, overflow="fold")
    for row in rows:
        t.add_row(row["name"], row["hardware"], row["target"], row["weights"], str(row["tp"]), row["backend"])
    console.print(t)
    # The paths in full, one per line (a table column would cut them): what to pass as RECIPE.
    for row in rows:
        print(f"{row['name']}: {row['path']}")
    return 0
