"""The quantize stage's Transform for the trtllm layout: the converter hands it every planned
TensorRT-LLM tensor and it writes FP8 / NVFP4 tensors, their scales (packed by formats/quant.py
from a Calibration's amaxes) and each layer's FP8 KV cache scales.
"""

from __future__ import annotations

import json

import torch

from trtllm_dflash.errors import UserError
from trtllm_dflash.formats import quant as F
from trtllm_dflash.quantize.calibration import Calibration
from trtllm_dflash.quantize.quantize import QuantPlan, Scheme


class QuantTransform:
    """Turns planned TensorRT-LLM tensors into FP8 / NVFP4 tensors + scales (convert's Transform).

    Scales come from the group of source linears a tensor shares them with (q/k/v fused into
    qkv, gate/up fused at build time): one weight amax and one input amax per group, the
    largest member's, as TensorRT-LLM's fused GEMMs require and ModelOpt's export does.
    """

    def __init__(self, plan: QuantPlan, calibration: dict[str, Calibration]):
        self.plan, self.calibration = plan, calibration

    def scheme(self, role: str) -> Scheme:
        return self.plan.target if role == "target" else self.plan.drafter

    def dtype(self, role: str) -> torch.dtype:
        return self.plan.dtypes[role]

    def _quantized(self, role: str, t) -> bool:
        return t.entry.linear and self.scheme(role) is not Scheme.NONE

    def validate(self, plan, calibrated: bool = True) -> None:
        """Every quantized tensor of `plan` can be written: no MoE experts, NVFP4-aligned shards
        and, when `calibrated`, calibration for every GEMM it fuses."""
        for planned in plan.ranks:
            for t in planned:
                if not self._quantized(plan.role, t):
                    continue
                if t.entry.rule.startswith("experts_"):
                    raise NotImplementedError(
                        f"{t.name}: quantized MoE experts in the TensorRT-LLM checkpoint layout; the engine backend "
                        "does not serve qwen3_moe (TensorRT-LLM 1.2 engine path) - use the pytorch backend (ModelOpt "
                        "HF export)"
                    )
                if self.scheme(plan.role) is Scheme.NVFP4 and t.shape[-1] % F.NVFP4_BLOCK:
                    raise UserError(
                        f"{t.name}: {t.shape[-1]} input features per rank (tp {plan.tp}) is not a multiple of "
                        f"{F.NVFP4_BLOCK}, NVFP4's block; choose a tp that keeps every row-parallel shard 16-aligned"
                    )
                missing = [n for n in t.group if n not in self.calibration[plan.role].linears] if calibrated else []
                if missing:
                    raise UserError(f"{t.name}: no calibration for {missing[0]}")

    def outputs(self, role, t):
        if not self._quantized(role, t):
            return [(t.name, t.shape, getattr(torch, t.entry.dtype) if t.entry.dtype else self.dtype(role))]
        prefix = t.name.removesuffix(".weight")
        act = self.plan.activations
        if self.scheme(role) is Scheme.FP8:
            out = [(t.name, t.shape, torch.float8_e4m3fn), (f"{prefix}.weights_scaling_factor", (1,), torch.float32)]
            return out + ([(f"{prefix}.activation_scaling_factor", (1,), torch.float32)] if act else [])
        k = t.shape[-1]
        out = [
            (t.name, t.shape[:-1] + (k // 2,), torch.uint8),
            (f"{prefix}.weights_scaling_factor", t.shape[:-1] + (k // F.NVFP4_BLOCK,), torch.float8_e4m3fn),
            (f"{prefix}.weights_scaling_factor_2", (), torch.float32),
        ]
        return out + ([(f"{prefix}.activation_scaling_factor", (), torch.float32)] if act else [])

    def apply(self, role, t, x):
        if not self._quantized(role, t):
            return {t.name: x.to(getattr(torch, t.entry.dtype) if t.entry.dtype else self.dtype(role))}
        calib = self.calibration[role]
        prefix = t.name.removesuffix(".weight")
        w_amax, in_amax = calib.weight_amax(t.group), calib.input_amax(t.group)
        x = x.to(self.dtype(role))  # quantize from the checkpoint's precision, as ModelOpt does
        if self.scheme(role) is Scheme.FP8:
            q = F.quantize_fp8(x, F.fp8_scale(w_amax), fp32_quotient=True)  # as ModelOpt's TensorRT-LLM export
            out = {t.name: q.data, f"{prefix}.weights_scaling_factor": q.scale.reshape(1)}
            if self.plan.activations:
                out[f"{prefix}.activation_scaling_factor"] = F.fp8_scale(in_amax).reshape(1)
            return out
        q = F.quantize_nvfp4(x, F.nvfp4_global_scale(w_amax))
        out = {t.name: q.data, f"{prefix}.weights_scaling_factor": q.block_scale,
               f"{prefix}.weights_scaling_factor_2": q.global_scale}
        if self.plan.activations:
            out[f"{prefix}.activation_scaling_factor"] = F.nvfp4_global_scale(in_amax)
        return out

    def extras(self, role, layer, rank):
        if not self.plan.kv_fp8 or layer not in self.calibration[role].kv:
            return {}
        kv = self.calibration[role].kv[layer]
        # ModelOpt's FP8 KV convention: amax / 448, but never below 1 (TensorRT-LLM's default scale)
        k, v = (torch.maximum(F.fp8_scale(kv[x]), torch.tensor(1.0)).reshape(1) for x in ("k", "v"))
        p = f"transformer.layers.{layer}.attention."
        return {p + "kv_cache_scaling_factor": torch.maximum(k, v), p + "k_cache_scaling_factor": k,
                p + "v_cache_scaling_factor": v}

    def quantization(self, role):
        s = self.scheme(role)
        out = {"quant_algo": s.quant_algo, "kv_cache_quant_algo": "FP8" if self.plan.kv_fp8 else None}
        if s is Scheme.NVFP4:
            out["group_size"] = F.NVFP4_BLOCK
        if s is not Scheme.NONE:
            out["exclude_modules"] = ["lm_head"]
            if not self.plan.activations:
                out["weight_only"] = True  # reference backend: activations stay in high precision
        return out

    def describe(self):
        import hashlib

        blob = json.dumps({r: c.to_json() for r, c in self.calibration.items()}, sort_keys=True)
        return {"transform": "quantize", **self.plan.describe(),
                "calibration_sha256": hashlib.sha256(blob.encode()).hexdigest()}
