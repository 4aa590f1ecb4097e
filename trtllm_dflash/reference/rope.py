"""The rotary embedding's config: theta and scaling read from a config.json (transformers 4.x
`rope_theta` / `rope_scaling`, or 5.x `rope_parameters`), and the inverse frequencies they give
(target.py's Rope turns them into cos / sin tables). RoPE types we do not implement are refused
here, by name."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from trtllm_dflash.reference.fields import Fields


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding: NeoX rotate-half over the whole head_dim.

    `scaling` is None (plain), ("linear", factor) or ("llama3", factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings)."""

    theta: float
    scaling: tuple | None = None

    def inv_freq(self, head_dim: int) -> torch.Tensor:  # [head_dim // 2] fp32
        exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        inv = 1.0 / (self.theta**exponent)
        if self.scaling is None:
            return inv
        if self.scaling[0] == "linear":
            return inv / self.scaling[1]
        # Llama 3.1 frequency-dependent scaling: long wavelengths are divided by `factor`,
        # short ones kept, the band in between interpolated smoothly.
        _, factor, low, high, old_len = self.scaling
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, blended, scaled)

    @staticmethod
    def from_dict(f: Fields, head_dim_default_theta: float = 10000.0) -> RopeConfig:
        raw = f.raw
        params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        if not isinstance(params, dict):
            raise f.fail(f"'rope_parameters' / 'rope_scaling' is {params!r}, expected an object")
        if any(k in params for k in ("full_attention", "sliding_attention")):
            # transformers 5 nests a RoPE per layer type (Laguna: YaRN on full layers, linear on sliding)
            raise f.fail("rope_parameters per layer type (full_attention / sliding_attention) are not supported by "
                         "the reference backend")
        theta = f.float("rope_theta", default=None, src=params) or f.float("rope_theta", default=head_dim_default_theta)
        if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
            raise f.fail("partial_rotary_factor != 1 is not supported by the reference backend")
        kind = params.get("rope_type", params.get("type", "default"))
        if kind == "default":
            return RopeConfig(theta)
        if kind == "linear":
            return RopeConfig(theta, ("linear", f.float("factor", src=params)))
        if kind == "llama3":
            keys = ("factor", "low_freq_factor", "high_freq_factor")
            vals = tuple(f.float(k, src=params) for k in keys)
            old = params.get("original_max_position_embeddings") or raw.get("max_position_embeddings")
            if vals[2] <= vals[1]:
                raise f.fail("llama3 rope: high_freq_factor must be greater than low_freq_factor")
            return RopeConfig(theta, ("llama3", *vals, float(old)))
        raise f.fail(
            f"rope type {kind!r} is not supported by the reference backend (supported: default, linear, llama3)"
        )
