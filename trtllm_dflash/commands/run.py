"""`trtllm-dflash run RECIPE [--out DIR] [--until STAGE] [--force STAGE]`: the whole pipeline.

convert -> quantize -> build -> deploy -> serve -> sweep into DIR/<stage>/ (default
runs/<recipe name>/), skipping every stage whose output is current (trtllm_dflash/pipeline.py).
Exit codes: 0 done, 2 bad input, 3 stopped at a stage that runs on another machine (the last
line says which command to run where).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trtllm_dflash.commands.common import add_recipe_argument, make_console
from trtllm_dflash.recipe.stages import STAGES


def register(sub: argparse._SubParsersAction) -> None:
    # (demo registers the same arguments; only the parser name, help and run function differ)
    p = sub.add_parser("run", help="take a recipe through every stage (make-like: current stages are skipped)")
    add_recipe_argument(p)
    add_pipeline_arguments(p)
    p.set_defaults(run=run)


def add_pipeline_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=None, help="pipeline directory (default runs/<recipe name>)")
    p.add_argument("--until", choices=STAGES, default=None, help="stop after this stage")
    p.add_argument("--force", choices=STAGES, default=None, help="re-run this stage (and so every later one)")
    p.add_argument("--levels", default=None, help="sweep: comma-separated concurrency levels (default: the recipe's)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")


def run_pipeline(args: argparse.Namespace, console) -> tuple[int, Path, list]:
    """Shared by `run` and `demo`: (exit code, pipeline directory, stage runs)."""
    from trtllm_dflash.commands.sweep import parse_levels
    from trtllm_dflash.pipeline import STOPPED, StopHere, run
    from trtllm_dflash.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    out = args.out or Path("runs") / recipe.name
    levels = parse_levels(args.levels, recipe.sweep.concurrency)
    recipe_arg = args.recipe or "(default recipe)"

    def say(line: str) -> None:  # one line per event, never wrapped (people grep these)
        console.print(line, markup=False, soft_wrap=True)

    try:
        stages = run(recipe, out, until=args.until, force=args.force, recipe_arg=recipe_arg,
                     levels=levels if args.levels else None, progress=args.progress, say=say)
    except StopHere as e:
        say(f"stopped before {e}")
        return STOPPED, out, []
    return 0, out, stages


def run(args: argparse.Namespace) -> int:
    rc, _, _ = run_pipeline(args, make_console(highlight=False))
    return rc
