"""The `quantize` stage: `--from` a convert output, calibrate, write the quantized checkpoint.

It quantizes exactly the model the convert output was made from: the source checkpoints its
manifest lists, checked unchanged since (convert/sources.py recorded_sources). The quantize
package calibrates and packs (quantize.py, calibration.py, transform.py, formats/quant.py,
calibrate.py); the convert package lays the tensors out per rank (an earlier stage, so importing
it is allowed). Output layouts:
  trtllm  (reference / engine backends) per-rank TensorRT-LLM checkpoints with FP8 / NVFP4
          tensors and scales, written by the converter with a QuantTransform
  hf      (pytorch backend) ModelOpt's HF export of the target + the drafter in z-lab layout
Both carry `calibration.json` (every amax, so every scale can be re-derived).

The door (`run`, the contract: recipe/stages.py) is what the pipeline calls; the `quantize`
command calls `quantize` with its own options. Stale when: the recipe fields quantize depends
on (convert's and `quantization`) or its convert input changed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from trtllm_dflash import compat
from trtllm_dflash.artifacts import (
    MANIFEST,
    Manifest,
    atomic_stage_dir,
    check_out_dir,
    relative_to,
    replace_dir,
    tool_versions,
    verify_input,
)
from trtllm_dflash.convert.convert import convert
from trtllm_dflash.convert.shard_plan import plan_trtllm
from trtllm_dflash.convert.sources import BACKEND_LAYOUT, recorded_sources
from trtllm_dflash.errors import UserError
from trtllm_dflash.quantize import guard
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.plan.drafter import drafter_placement
from trtllm_dflash.recipe.stages import StageOptions

NAME = "quantize"
WRITES_OUTPUT = True


def fingerprint(recipe: Recipe, options: StageOptions) -> dict:
    return {}


def run(recipe: Recipe, input_dir: Path | None, out: Path, options: StageOptions) -> Path:
    """Quantize the convert output `input_dir` into `out`, resuming from finished shards, with the
    acceptance guardrail where `options.measure` gives this machine a decoder."""
    measure = options.measure(recipe) if options.measure else None
    return quantize(recipe, input_dir, out, overwrite=True, resume=True, progress=options.progress, measure=measure)


def quantize(recipe: Recipe, from_dir: Path, out: Path, *, calib: Path | None = None, samples: int | None = None,
             length: int | None = None, device: str | None = None, overwrite: bool = False, resume: bool = False,
             progress: bool = True, measure: guard.Measure | None = None, prompts: Path | None = None) -> Path:
    """The quantize stage; see the module docstring. Everything that can be checked (recipe,
    input, sources, tp alignment, output directory) is checked before calibrating. `measure`:
    how to decode a checkpoint for the acceptance guardrail (quantize/guard.py; None: not run);
    `prompts`: the guard's prompts (a JSONL / ShareGPT file) instead of the calibration data's."""
    from trtllm_dflash.quantize.quantize import export_hf, resolve
    from trtllm_dflash.quantize.transform import QuantTransform

    out, from_dir = Path(out), Path(from_dir)
    plan = resolve(recipe)
    layout = BACKEND_LAYOUT[recipe.backend.name]
    m, src = _checked_input(recipe, from_dir, layout, plan)
    check_out_dir(out, Manifest.for_stage("quantize", recipe, from_dir), overwrite)
    q = recipe.quantization
    samples, length = samples or q.calib_samples, length or q.calib_len  # arguments: tests' smaller calibrations
    model, calibration, data = _calibrate(recipe, plan, src, calib, samples, length, device, progress)
    record = json.dumps({r: c.to_json() for r, c in calibration.items()}, indent=1, sort_keys=True)
    extra = {"quantization": plan.describe(), "calibration_data": data.source,
             "calibration": {"samples": samples, "len": length},
             "tools": tool_versions("nvidia-modelopt")}

    if layout == "trtllm":
        with tempfile.TemporaryDirectory() as d:
            calib_file = Path(d) / "calibration.json"
            calib_file.write_text(record)
            args = dict(layout="trtllm", transform=QuantTransform(plan, calibration), stage="quantize",
                        input_dir=from_dir, sources=src, progress=progress, extra=extra,
                        extra_files={"calibration.json": calib_file})
            if measure is None:
                extra["acceptance_guard"] = {"ran": False, "why": "no decoder given (quantize/guard.py)"}
                return convert(recipe, out, overwrite=overwrite, resume=resume, **args)
            if prompts is not None:
                ids, source = guard.user_prompts(prompts, src.target_dir), f"prompts of {prompts}"
            else:
                ids, source = guard.calibration_prompts(data.batches), f"calibration sequences ({data.source})"
            return _guarded(recipe, from_dir, out, overwrite, measure, ids, source, args)
    extra["acceptance_guard"] = {"ran": False, "why": "the HF export is decoded by TensorRT-LLM (pytorch backend)"}
    manifest = Manifest.for_stage("quantize", recipe, from_dir, sources=m.sources,
                                  tools=tool_versions("nvidia-modelopt"),
                                  extra={"layout": "hf", **extra})
    with atomic_stage_dir(out, manifest, overwrite=overwrite) as tmp:
        export_hf(model, tmp, recipe, src.target_dir, src.drafter_dir, plan)
        (tmp / "calibration.json").write_text(record)
    return out


def _checked_input(recipe: Recipe, from_dir: Path, layout: str, plan):
    """(manifest, recorded sources) of the convert output, its layout and, for the TensorRT-LLM
    layout, every tensor's tp split and alignment checked before anything is calibrated."""
    from trtllm_dflash.quantize.calibration import Calibration
    from trtllm_dflash.quantize.transform import QuantTransform

    m = verify_input(from_dir, ("convert",), recipe)
    if m.extra.get("layout") != layout:
        raise UserError(f"{from_dir}: manifest field extra.layout is {m.extra.get('layout')!r}; the "
                        f"{recipe.backend.name} backend quantizes the {layout} layout (convert without --layout)")
    src = recorded_sources(from_dir, m)  # configs, pairing, every tensor header
    if layout == "trtllm":
        transform = QuantTransform(plan, {"target": Calibration(), "drafter": Calibration()})
        # tp / alignment problems before calibrating (the drafter split as convert splits it)
        for p in plan_trtllm(src, recipe.parallel.tp, drafter_placement(recipe).tp).values():
            transform.validate(p, calibrated=False)
    return m, src


def _calibrate(recipe: Recipe, plan, src, calib: Path | None, samples: int, length: int, device: str | None,
               progress: bool):
    """(the calibrated HF target or None, {role: Calibration}, the calibration data)."""
    import torch

    from trtllm_dflash.quantize.calibration import Calibration, calibrate_drafter, calibrate_target, calibration_data
    from trtllm_dflash.quantize.quantize import Scheme

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
    return model, calibration, data


def _guarded(recipe: Recipe, from_dir: Path, out: Path, overwrite: bool, measure: guard.Measure,
             prompts: list[list[int]], source: str, convert_args: dict) -> Path:
    """Write the quantized checkpoint beside `out`, measure it against the unquantized one, and
    make it the output only when the acceptance guardrail passes (its numbers in the manifest);
    otherwise remove it and stop with both numbers. The directory is named as an interrupted
    write's, so a killed run's leftover is cleaned up by the next one (artifacts.py)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-{os.getpid()}-guard-", dir=out.parent))
    try:
        staged = convert(recipe, staging / "checkpoint", overwrite=False, resume=False, **convert_args)
        result = guard.check(measure, from_dir, staged, prompts, recipe.speculative.block_size,
                             recipe.quantization.max_acceptance_drop, source)
        if not result.passed:
            raise UserError(result.message())
        manifest = Manifest.read(staged)
        manifest.extra["acceptance_guard"] = result.to_json()
        if manifest.input is not None:  # relative to the staging directory, which is not out's sibling
            manifest.input["path"] = relative_to(manifest.input_dir(staged), out)
        (staged / MANIFEST).write_text(manifest.to_json())
        check_out_dir(out, manifest, overwrite)
        replace_dir(staged, out)
        return out
    finally:
        shutil.rmtree(staging, ignore_errors=True)
