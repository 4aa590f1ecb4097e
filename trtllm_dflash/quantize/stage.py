"""The `quantize` stage: `--from` a convert output, calibrate, write the quantized checkpoint.

It quantizes exactly the model the convert output was made from: the source checkpoints its
manifest lists, checked unchanged since (convert.recorded_sources). The quantize package
calibrates and packs (quantize.py, formats.py, calibrate.py); the convert package lays the
tensors out per rank (an earlier stage, so importing it is allowed). Output layouts:
  trtllm  (reference / engine backends) per-rank TensorRT-LLM checkpoints with FP8 / NVFP4
          tensors and scales, written by the converter with a QuantTransform
  hf      (pytorch backend) ModelOpt's HF export of the target + the drafter in z-lab layout
Both carry `calibration.json` (every amax, so every scale can be re-derived).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from trtllm_dflash import compat
from trtllm_dflash.artifacts import Manifest, atomic_stage_dir, check_out_dir, tool_versions, verify_input
from trtllm_dflash.convert.convert import BACKEND_LAYOUT, convert, plan_trtllm, recorded_sources
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.planner import drafter_placement


def quantize(recipe: Recipe, from_dir: Path, out: Path, *, calib: Path | None = None, samples: int = 32,
             length: int = 256, device: str | None = None, overwrite: bool = False, resume: bool = False,
             progress: bool = True) -> Path:
    """The quantize stage; see the module docstring. Everything that can be checked (recipe,
    input, sources, tp alignment, output directory) is checked before calibrating."""
    import torch

    from trtllm_dflash.quantize.quantize import (
        Calibration, QuantTransform, Scheme, calibrate_drafter, calibrate_target, calibration_data, export_hf,
        resolve,
    )

    out, from_dir = Path(out), Path(from_dir)
    plan = resolve(recipe)
    layout = BACKEND_LAYOUT[recipe.backend.name]
    m = verify_input(from_dir, ("convert",), recipe)
    if m.extra.get("layout") != layout:
        raise UserError(f"{from_dir}: manifest field extra.layout is {m.extra.get('layout')!r}; the {recipe.backend.name} "
                        f"backend quantizes the {layout} layout (convert without --layout)")
    src = recorded_sources(from_dir, m)  # configs, pairing, every tensor header
    if layout == "trtllm":
        transform = QuantTransform(plan, {"target": Calibration(), "drafter": Calibration()})
        # tp / alignment problems before calibrating (the drafter split as convert splits it)
        for p in plan_trtllm(src, recipe.parallel.tp, drafter_placement(recipe).tp).values():
            try:
                transform.validate(p)
            except Exception as e:
                if "no calibration" not in str(e):
                    raise
    check_out_dir(out, Manifest.for_stage("quantize", recipe, from_dir), overwrite)
    calibrate_target_too = plan.target is not Scheme.NONE or plan.kv_fp8
    if calibrate_target_too:
        compat.require_modelopt()
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
                input_dir=from_dir, sources=src, overwrite=overwrite, resume=resume, progress=progress,
                extra=extra, extra_files={"calibration.json": calib_file},
            )
    manifest = Manifest.for_stage("quantize", recipe, from_dir, sources=m.sources, tools=tool_versions("nvidia-modelopt"),
                                  extra={"layout": "hf", **extra})
    with atomic_stage_dir(out, manifest, overwrite=overwrite) as tmp:
        export_hf(model, tmp, recipe, src.target_dir, src.drafter_dir, plan)
        (tmp / "calibration.json").write_text(record)
    return out
