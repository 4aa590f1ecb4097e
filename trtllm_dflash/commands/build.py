"""`trtllm-dflash build RECIPE [--from DIR] --out DIR [--dry-run]`: TensorRT-LLM 1.2.x engines for
the engine backend: a build_config.json per engine and the stock trtllm-build command for each."""

from __future__ import annotations

import argparse
from pathlib import Path

from trtllm_dflash.commands.common import add_recipe_argument


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "build",
        help="engine backend: write build_config.json per engine and run (or, with --dry-run, print) trtllm-build",
        description="Target (the stock Qwen3 / Llama class with the DFlash tap) and drafter (our class with the "
        "KV-injection plugin) engines, built by the stock trtllm-build with --build_config, --model_cls_file and "
        "--model_cls_name. Writes OUT/plan.json (commands, plugins, I/O tensors) and OUT/<engine>/build_config.json; "
        "engines only where TensorRT-LLM 1.2.x is installed.",
    )
    add_recipe_argument(p)
    p.add_argument("--from", dest="from_dir", type=Path, default=None, metavar="DIR",
                   help="the quantize output (recipes that quantize), else the convert output; optional with --dry-run")
    p.add_argument("--out", type=Path, required=True, help="output directory (written atomically)")
    p.add_argument("--dry-run", action="store_true", help="write and print the plan; build nothing")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier build of the same recipe")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trtllm_dflash.engines.plan import render
    from trtllm_dflash.engines.stage import NotBuiltHere, build
    from trtllm_dflash.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    try:
        result = build(recipe, args.from_dir, args.out, dry_run=args.dry_run, overwrite=args.overwrite)
    except NotBuiltHere as e:
        print(render(e.plan, where=args.out))  # the plan is written; the error line says where to build it
        raise
    print(render(result.plan, where=result.out))
    what = "engines" if result.built else "plan only (dry run): plan.json, target/ and drafter/build_config.json"
    print(f"built {recipe.name}: {result.out} ({what})")
    return 0
