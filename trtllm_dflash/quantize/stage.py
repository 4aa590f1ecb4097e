"""The `quantize` stage: calibrate, then write the quantized checkpoint the backend loads.

The quantize package calibrates and packs (quantize.py, formats.py, calibrate.py); the convert
package lays the tensors out per rank (an earlier stage, so importing it is allowed).
"""

from __future__ import annotations

from pathlib import Path


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
    """The quantize stage; see the module docstring."""
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
