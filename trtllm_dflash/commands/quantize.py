"""`trtllm-dflash quantize RECIPE --from CONVERT_DIR --out DIR`: calibrate and write FP8 / NVFP4 checkpoints.

pytorch backend: ModelOpt's HF export of the target (+ the drafter, bf16). engine / reference
backends: TensorRT-LLM per-rank checkpoints with quantized tensors and scales, written by the
converter. Everything is validated (recipe, sources, output directory) before calibrating.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trtllm_dflash.commands.common import add_recipe_argument, add_stage_output_arguments


def register(sub: argparse._SubParsersAction) -> None:
    # (alike in form to convert's register: every command registers its own parser and help)
    p = sub.add_parser(
        "quantize",
        help="calibrate (nvidia-modelopt) and write FP8 / NVFP4 checkpoints for the recipe's backend",
        description="FP8: E4M3 weights with a per-tensor scale (W8A8). NVFP4: E2M1 weights, E4M3 scale per 16, FP32 "
        "global scale (W4A4). Target through ModelOpt; the drafter (quantization.drafter) through the reference loop.",
    )
    add_recipe_argument(p)
    p.add_argument("--from", dest="from_dir", type=Path, required=True, metavar="DIR",
                   help="the convert output of this recipe (its sources are what gets quantized)")
    add_stage_output_arguments(p, "quantize")
    p.add_argument("--calib", type=Path, default=None, help="calibration text (.txt) or JSONL with 'text'/'prompt' "
                   "(default: the built-in calibration text, or random ids when the target has no tokenizer)")
    p.add_argument("--calib-samples", type=int, default=None,
                   help="calibration sequences (default: the recipe's quantization.calib_samples, 32)")
    p.add_argument("--calib-len", type=int, default=None,
                   help="tokens per calibration sequence (default: the recipe's quantization.calib_len, 256)")
    p.add_argument("--device", default=None, help="calibration device (default: cuda if available, else cpu)")
    p.add_argument("--prompts", type=Path, default=None, metavar="FILE",
                   help="the acceptance guardrail's prompts (JSONL / ShareGPT, as `profile` reads; default: the first "
                   "calibration sequences); tau may fall by at most quantization.max_acceptance_drop")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trtllm_dflash.pipeline import acceptance_measure
    from trtllm_dflash.quantize.stage import quantize
    from trtllm_dflash.recipe import load_recipe

    # The flags are recipe overrides, so the manifest's recipe fields record what calibrated.
    flags = {"calib_samples": args.calib_samples, "calib_len": args.calib_len}
    overrides = [f"quantization.{k}={v}" for k, v in flags.items() if v is not None]
    recipe = load_recipe(args.recipe, [*args.overrides, *overrides])
    out = quantize(
        recipe, args.from_dir, args.out, calib=args.calib, device=args.device,
        overwrite=args.overwrite, resume=args.resume, progress=args.progress,
        measure=acceptance_measure(recipe), prompts=args.prompts,
    )
    print(f"quantized {recipe.name}: {out}")
    return 0
