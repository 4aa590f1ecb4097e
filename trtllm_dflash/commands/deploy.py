"""`trtllm-dflash deploy RECIPE --from DIR --out DIR`: the Triton model repository serving a stage output."""

from __future__ import annotations

import argparse
from pathlib import Path

from trtllm_dflash.commands.common import add_recipe_argument


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("deploy",
                       help="write a Triton model repository serving a stage output (config.pbtxt from typed objects)")
    add_recipe_argument(p)
    p.add_argument("--from", dest="from_dir", type=Path, required=True, metavar="DIR",
                   help="what to serve: the quantize output (recipes that quantize), else the convert output; "
                   "the build output on the engine backend")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier deploy of the same recipe")
    p.add_argument("--plan-only", action="store_true",
                   help="engine backend: deploy a dry-run build (no engines); it serves only with --runners reference "
                   "or emulated until the engines are built and it is deployed again")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trtllm_dflash.deploy.repository import deploy
    from trtllm_dflash.deploy.settings import REPOSITORY
    from trtllm_dflash.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    out = deploy(recipe, args.from_dir, args.out, overwrite=args.overwrite, plan_only=args.plan_only)
    print(f"deployed {recipe.name} ({recipe.backend.name} backend): {out / REPOSITORY / recipe.serve.model_name}")
    return 0
