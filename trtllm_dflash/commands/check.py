"""`trtllm-dflash check RECIPE`: validate a recipe; exit 2 with one line per problem. A valid
recipe gets its memory per rank and, on a GPU, the smallest tp that fits each GPU type."""

from __future__ import annotations

import argparse

from trtllm_dflash.commands.common import add_recipe_argument, make_console


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="validate a recipe (schema, hardware, parallelism, backend, memory per rank)")
    add_recipe_argument(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from trtllm_dflash.commands.plan import print_memory
    from trtllm_dflash.recipe import check, load_recipe

    recipe = load_recipe(args.recipe, args.overrides, planning=True)  # raises RecipeError on any error, memory included
    for issue in check(recipe):
        print(f"note: {issue.field}: {issue.message}", file=sys.stderr)
    where = args.recipe or "(default recipe)"
    print(f"ok: {where}: {recipe.name} ({recipe.hardware.count}x {recipe.hardware.gpu}, {recipe.backend.name} backend)")
    print_memory(make_console(), recipe)
    return 0
