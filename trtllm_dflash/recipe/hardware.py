"""Hardware catalog: the per-device facts that validation and planning use.

Code never sniffs GPU names; it asks a `GpuSpec` (SM, memory, bandwidth, peak rates,
supported number formats). Unknown numbers are None, never a guess.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

Format = Literal["fp32", "bf16", "fp16", "fp8", "nvfp4", "mxfp4"]

# Bytes per element of each storage format, including block scales:
# NVFP4 = 4-bit E2M1 value + one E4M3 scale per 16 values = 4.5 bits;
# MXFP4 = 4-bit value + one E8M0 scale per 32 values = 4.25 bits.
BYTES_PER_ELEMENT: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "nvfp4": 4.5 / 8,
    "mxfp4": 4.25 / 8,
}

GB = 1e9
GiB = 2**30


class Measured(BaseModel):
    """Rates and costs measured on a real machine (`source` says how and where). Projections
    (trtllm_dflash/project) use them in place of the catalog's peak x an assumed efficiency and
    of the assumed overheads; a field left out keeps the assumption."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(description="how, where and when these were measured")
    memory_bandwidth_gbs: float | None = Field(default=None, gt=0,
                                               description="achieved streaming read bandwidth, GB/s")
    tensor_gflops: float | None = Field(default=None, gt=0,
                                        description="achieved dense matmul rate of the model's GEMMs, GFLOP/s")
    attention_fraction: float | None = Field(
        default=None, gt=0, le=1, description="attention kernel's achieved fraction of the memory bandwidth")
    layer_overhead_us: float | None = Field(default=None, ge=0,
                                            description="fixed cost per decoder layer per forward pass, us")
    step_overhead_ms: float | None = Field(default=None, ge=0,
                                           description="fixed launch/scheduling cost per decoding step, ms")
    seq_overhead_us: float | None = Field(default=None, ge=0,
                                          description="cost per sequence in flight per decoding step, us")


class GpuSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str
    sm: int | None = Field(description="CUDA compute capability x10 (90 Hopper, 100/103 Blackwell); None for cpu")
    memory_gb: float = Field(gt=0)
    hbm_bandwidth_tbs: float | None
    bf16_tflops: float | None
    fp8_tflops: float | None
    fp4_tflops: float | None
    nvlink_gbs: float | None = Field(description="NVLink bandwidth per GPU, both directions together, GB/s")
    nvlink_domain: int | None = Field(default=None, gt=0, description="GPUs that share one NVLink domain (None: "
                                      "one node's max_per_node; 72 on a GB300 NVL72 rack)")
    fabric_gbs: float | None = Field(default=None, gt=0, description="inter-node fabric (InfiniBand / RoCE) "
                                     "bandwidth per GPU, one direction, GB/s: the node's NIC share of one GPU")
    fabric_latency_us: float | None = Field(default=None, gt=0, description="latency of a small all-reduce "
                                            "across nodes over that fabric, us")
    formats: list[Format]
    max_per_node: int = Field(gt=0)
    measured: Measured | None = None

    def dense_tflops(self, fmt: str) -> float | None:
        """Peak dense tensor throughput for GEMMs whose inputs are in `fmt` (None when the catalog
        has none: fp32 and every rate on cpu)."""
        return {"bf16": self.bf16_tflops, "fp16": self.bf16_tflops, "fp8": self.fp8_tflops,
                "nvfp4": self.fp4_tflops, "mxfp4": self.fp4_tflops}.get(fmt)

    @property
    def is_cpu(self) -> bool:
        return self.sm is None

    @property
    def is_blackwell(self) -> bool:
        return self.sm is not None and self.sm >= 100

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * GB

    def supports(self, fmt: str) -> bool:
        return fmt in self.formats

    @property
    def domain(self) -> int:
        """GPUs one NVLink domain holds: tp above it all-reduces over the inter-node fabric."""
        return self.nvlink_domain or self.max_per_node


@lru_cache(maxsize=1)
def hardware_catalog() -> dict[str, GpuSpec]:
    text = resources.files("trtllm_dflash.recipe.catalog").joinpath("hardware.yaml").read_text()
    return {name: GpuSpec(name=name, **facts) for name, facts in yaml.safe_load(text).items()}


def cpu_torch_threads(tp: int, cpu_count: int | None = None) -> int:
    """Torch threads per model process of a CPU deployment. tp 1: every core but one (the front
    end - Triton's gRPC / HTTP threads and the Python backend's messages, or uvicorn - and clients
    on the same machine need a core; a torch thread that shares one with them stalls every
    parallel op: docs/design/measurements.md, docs/results/cpu-benchmarks.md "Serving overhead").
    tp > 1: the cores split between the worker processes. The server, its tp workers and the projection's calibration
    all use this."""
    import os

    cores = cpu_count or os.cpu_count() or 1
    return max(1, cores - 1) if tp == 1 else max(1, cores // tp)
