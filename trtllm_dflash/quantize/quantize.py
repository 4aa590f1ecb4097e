"""The `quantize` stage: calibrate, then write FP8 / NVFP4 checkpoints for a backend.

Schemes are an enum resolved once from the recipe (never flag combinations downstream):
  FP8    E4M3 weights, one scale per tensor; W8A8 with static FP8 input scales
  NVFP4  E2M1 weights, E4M3 scale per 16, FP32 global; W4A4 with static global input scales
  KV     an FP8 KV cache gets per-layer k / v scales (ModelOpt's convention: amax / 448, at least 1)
On the reference backend activations stay in high precision (weight-only emulation); the
engine and pytorch backends need activations in the weight format (W8A8 / W4A4).

Who does what:
  target   nvidia-modelopt calibrates the HF model (`mtq.quantize`, max calibration, on CPU
           or GPU; NVFP4 calibration and export run on CPU even though its fake-quant forward
           does not). pytorch backend: ModelOpt's `export_hf_checkpoint` writes the HF-layout
           checkpoint (hf_quant_config.json, quantized safetensors). engine / reference
           backends: the amaxes ModelOpt collected drive our converter, which writes the
           TensorRT-LLM per-rank checkpoint with tensors packed by formats/quant.py (equal to
           ModelOpt's own packing: tests/quantize/test_modelopt_parity.py).
  drafter  (optional) calibrated by running the reference DFlash loop with max-calibration
           hooks (calibrate.py; ModelOpt knows no DFlash forward), packed by formats/quant.py.
The amaxes are written to `calibration.json` in the output: every scale can be re-derived.

This module resolves the recipe into a QuantPlan and writes the HF export; calibration.py
calibrates both models, transform.py (QuantTransform) quantizes the converter's tensors.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import torch

from trtllm_dflash import compat
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.plan.engine_layout import QUANT_ALGO
from trtllm_dflash.recipe.support import backend as backend_spec

FLOAT_FORMATS = ("fp32", "bf16", "fp16")
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Scheme(str, Enum):
    NONE = "none"
    FP8 = "fp8"
    NVFP4 = "nvfp4"

    @property
    def quant_algo(self) -> str | None:
        return QUANT_ALGO.get(self.value)


@dataclass(frozen=True)
class QuantPlan:
    """What the recipe asks for, resolved and checked."""

    target: Scheme
    drafter: Scheme
    activations: bool  # quantize GEMM inputs (static scales); False = weight-only emulation
    kv_fp8: bool
    dtypes: dict  # role -> torch dtype of everything not quantized

    def describe(self) -> dict:
        return {
            "target": self.target.value, "drafter": self.drafter.value, "activations": self.activations,
            "kv_cache": "fp8" if self.kv_fp8 else None,
            "dtypes": {k: str(v).removeprefix("torch.") for k, v in self.dtypes.items()},
        }


def resolve(recipe: Recipe) -> QuantPlan:
    """The recipe's quantization section as a plan; UserError naming the field otherwise."""
    q, backend = recipe.quantization, recipe.backend.name
    at = recipe.field_at  # where each field was written (its YAML line and column, or the --set)

    def scheme(field_: str, fmt: str) -> Scheme:
        if fmt in FLOAT_FORMATS:
            return Scheme.NONE
        if fmt in ("fp8", "nvfp4"):
            return Scheme(fmt)
        raise UserError(f"{at('quantization.' + field_)}: {fmt} is not produced by quantize; allowed: fp8, nvfp4, "
                        f"{', '.join(FLOAT_FORMATS)}")

    target, drafter = scheme("target_weights", q.target_weights), scheme("drafter", q.drafter)
    if not q.quantizes:
        raise UserError(
            f"{at('quantization.target_weights')} is {q.target_weights}, quantization.drafter is {q.drafter} and "
            f"quantization.kv_cache is {q.kv_cache}: nothing to quantize (run `convert`); set one of them to fp8 "
            "(or the weights to nvfp4)"
        )
    activations = q.activations not in FLOAT_FORMATS
    if not backend_spec(backend).emulates_quantization:
        for who, s in (("target_weights", target),) + ((("drafter", drafter),) if drafter is not Scheme.NONE else ()):
            if s is not Scheme.NONE and q.activations != s.value:
                raise UserError(
                    f"{at('quantization.activations')}: {q.activations} with {s.value} quantization.{who} on the "
                    f"{backend} backend; allowed: activations {s.value} (W8A8 FP8 / W4A4 NVFP4; weight-only runs only "
                    "on the reference backend)"
                )
    elif activations:
        activations = False  # the reference emulates weights only (recipe rules warn about it)
    if q.kv_cache not in FLOAT_FORMATS + ("fp8",):
        raise UserError(f"{at('quantization.kv_cache')}: {q.kv_cache} is not implemented; allowed: fp8, "
                        f"{', '.join(FLOAT_FORMATS)}")
    dtypes = {role: TORCH_DTYPES[q.checkpoint_dtype(role)] for role in ("target", "drafter")}
    return QuantPlan(target, drafter, activations, q.kv_cache == "fp8", dtypes)


# ----------------------------------------------------------------------------- the HF layout (pytorch backend)


def export_hf(model, tmp: Path, recipe: Recipe, target_dir: Path, drafter_dir: Path, plan: QuantPlan) -> None:
    """ModelOpt's unified HF export of the calibrated target + the drafter in z-lab layout."""
    from modelopt.torch.export import export_hf_checkpoint

    from trtllm_dflash.reference import load_drafter, save_drafter

    with warnings.catch_warnings(), compat.modelopt_nvfp4():
        warnings.simplefilter("ignore")
        export_hf_checkpoint(model, export_dir=tmp / "target", dtype=plan.dtypes["target"])
    compat.modelopt_hf_export_as_current(model, tmp / "target")
    for p in sorted(target_dir.iterdir()):
        keep = p.is_file() and (p.name.startswith("tokenizer") or p.name in (
            "special_tokens_map.json", "vocab.json", "merges.txt", "chat_template.jinja"))
        if keep and not (tmp / "target" / p.name).exists():
            (tmp / "target" / p.name).write_bytes(p.read_bytes())
    drafter = load_drafter(drafter_dir, dtype=plan.dtypes["drafter"])
    save_drafter(drafter, tmp / "drafter", dtype=plan.dtypes["drafter"])
    raw = json.loads((drafter_dir / "config.json").read_text())
    saved = json.loads((tmp / "drafter" / "config.json").read_text())
    # keep every key of the original drafter config (vocab_size, ...) that save_drafter does not write
    (tmp / "drafter" / "config.json").write_text(json.dumps({**raw, **saved}, indent=2) + "\n")

