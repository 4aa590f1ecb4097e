"""`trtllm-dflash convert RECIPE --out DIR`: HF target + z-lab drafter -> the backend's checkpoint layout."""

from __future__ import annotations

import argparse

from trtllm_dflash.commands.common import add_recipe_argument, add_stage_output_arguments


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert",
        help="write the checkpoints the backend loads (TensorRT-LLM per-rank shards, or HF layout)",
        description="engine / reference backends: TensorRT-LLM 1.2.x checkpoints, config.json + rank{r}.safetensors "
        "per TP rank, for the target and the drafter; pytorch backend: HF layout in the recipe dtype.",
    )
    add_recipe_argument(p)
    add_stage_output_arguments(p, "convert")
    p.add_argument("--layout", choices=["trtllm", "hf"], default=None, help="override the backend's layout")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trtllm_dflash.convert.convert import convert
    from trtllm_dflash.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    out = convert(
        recipe, args.out, layout=args.layout, overwrite=args.overwrite, resume=args.resume, progress=args.progress
    )
    print(f"converted {recipe.name}: {out} (tp={recipe.parallel.tp})")
    return 0
