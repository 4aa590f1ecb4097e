"""`trtllm-dflash quantize RECIPE --out DIR`: calibrate and write FP8 / NVFP4 checkpoints.

pytorch backend: ModelOpt's HF export of the target (+ the drafter, bf16). engine / reference
backends: TensorRT-LLM per-rank checkpoints with quantized tensors and scales, written by the
converter. Everything is validated (recipe, sources, output directory) before calibrating.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trtllm_dflash.commands.common import add_recipe_argument


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "quantize",
        help="calibrate (nvidia-modelopt) and write FP8 / NVFP4 checkpoints for the recipe's backend",
        description="FP8: E4M3 weights with a per-tensor scale (W8A8). NVFP4: E2M1 weights, E4M3 scale per 16, FP32 "
        "global scale (W4A4). Target through ModelOpt; the drafter (quantization.drafter) through the reference loop.",
    )
    add_recipe_argument(p)
    p.add_argument("--out", type=Path, required=True, help="output directory (written atomically)")
    p.add_argument("--calib", type=Path, default=None, help="calibration text (.txt) or JSONL with 'text'/'prompt' "
                   "(default: Python standard library sources, or random ids when the target has no tokenizer)")
    p.add_argument("--calib-samples", type=int, default=32, help="calibration sequences (default 32)")
    p.add_argument("--calib-len", type=int, default=256, help="tokens per calibration sequence (default 256)")
    p.add_argument("--device", default=None, help="calibration device (default: cuda if available, else cpu)")
    p.add_argument("--resume", action="store_true", help="keep the shards an interrupted run of the same inputs finished")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier quantize output of the same recipe")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trtllm_dflash.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    out = quantize(
        recipe, args.out, calib=args.calib, samples=args.calib_samples, length=args.calib_len, device=args.device,
        overwrite=args.overwrite, resume=args.resume, progress=args.progress,
    )
    print(f"quantized {recipe.name}: {out}")
    return 0


def _refuse_existing(out: Path, recipe, overwrite: bool) -> None:
    """Fail before the (long) calibration when the output directory would be refused anyway
    (the same rules `artifacts.atomic_stage_dir` applies when writing)."""
    from trtllm_dflash.artifacts import MANIFEST, Manifest
    from trtllm_dflash.errors import UserError

    if not out.exists():
        return
    if not (out / MANIFEST).exists():
        if any(out.iterdir()):
            raise UserError(f"{out}: exists and is not a trtllm-dflash output; choose another --out")
        return
    old = Manifest.read(out)
    if old.stage != "quantize" or old.recipe_sha256 != recipe.sha256():
        raise UserError(f"{out}: already holds a {old.stage} output of recipe {old.recipe!r} (different content); choose another --out or remove it")
    if not overwrite:
        raise UserError(f"{out}: already holds this quantize output; pass --overwrite to redo it")


def quantize(recipe, out: Path, *, calib: Path | None = None, samples: int = 32, length: int = 256, device: str | None = None,
             overwrite: bool = False, resume: bool = False, progress: bool = True) -> Path:
    """The quantize stage. This command module joins the two stages it needs: the quantize
    package calibrates and packs, the convert package lays the tensors out per rank."""
    import json
    import tempfile

    import torch

    from trtllm_dflash.artifacts import Manifest, atomic_stage_dir, sha256_file, tool_versions
    from trtllm_dflash.convert.convert import BACKEND_LAYOUT, convert, load_sources, plan_trtllm
    from trtllm_dflash.quantize.quantize import (
        Calibration, QuantTransform, Scheme, calibrate_drafter, calibrate_target, calibration_data, export_hf,
        require_modelopt, resolve,
    )

    out = Path(out)
    plan = resolve(recipe)
    layout = BACKEND_LAYOUT[recipe.backend.name]
    src = load_sources(recipe)  # configs, pairing, every tensor header
    if layout == "trtllm":
        transform = QuantTransform(plan, {"target": Calibration(), "drafter": Calibration()})
        for p in plan_trtllm(src, recipe.parallel.tp).values():  # tp / alignment problems before calibrating
            try:
                transform.validate(p)
            except Exception as e:
                if "no calibration" not in str(e):
                    raise
    _refuse_existing(out, recipe, overwrite)
    calibrate_target_too = plan.target is not Scheme.NONE or plan.kv_fp8
    if calibrate_target_too:
        require_modelopt()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    data = calibration_data(src.target_dir, src.target_cfg.vocab_size, calib, samples, length, seed=recipe.sweep.seed)

    calibration = {"target": Calibration(source=data.source), "drafter": Calibration(source=data.source)}
    model = None
    if calibrate_target_too:
        model, calibration["target"] = calibrate_target(src.target_dir, plan, data, device, progress)
    if plan.drafter is not Scheme.NONE:
        calibration["drafter"] = calibrate_drafter(src.target_dir, src.drafter_dir, data, progress=progress)
    record = json.dumps({r: c.to_json() for r, c in calibration.items()}, indent=1, sort_keys=True)
    extra = {"quantization": plan.describe(), "calibration_data": data.source, "tools": tool_versions("nvidia-modelopt")}

    if layout == "trtllm":
        with tempfile.TemporaryDirectory() as d:
            calib_file = Path(d) / "calibration.json"
            calib_file.write_text(record)
            return convert(
                recipe, out, layout="trtllm", transform=QuantTransform(plan, calibration), stage="quantize",
                overwrite=overwrite, resume=resume, progress=progress, extra=extra,
                extra_files={"calibration.json": calib_file},
            )
    inputs = [{"role": role, "path": str(p), "sha256": sha256_file(p)} for role, p in src.input_files()]
    manifest = Manifest(stage="quantize", recipe=recipe.name, recipe_sha256=recipe.sha256(), inputs=inputs,
                        tools=tool_versions("nvidia-modelopt"), extra={"layout": "hf", **extra})
    with atomic_stage_dir(out, manifest, overwrite=overwrite) as tmp:
        export_hf(model, tmp, recipe, src.target_dir, src.drafter_dir, plan)
        (tmp / "calibration.json").write_text(record)
    return out
