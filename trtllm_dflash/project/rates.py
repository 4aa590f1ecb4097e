"""The rates a projection runs with (SI units): the hardware catalog's peaks times the assumed
efficiencies (`Assumptions`: every number no catalog gives, with where each comes from), or the
catalog entry's `measured` rates as they are; and the attention kernel's achieved fraction read
from a GPU run of perf/bench_kv_inject.py. The step model (stepmodel.py) prices its passes with
them."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from importlib import resources

from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe.hardware import GpuSpec

# The serving loop's own host cost per round, fixed + per request, as `trtllm-dflash bench loop
# --record` measured it with zero-cost runners (perf/bench_loop.py), with the machine it ran on.
LOOP_COST = json.loads(resources.files("trtllm_dflash.project").joinpath("loop_cost.json").read_text())


@dataclass(frozen=True)
class Assumptions:
    """Every number the model needs that no catalog gives: one set of defaults for every GPU.
    A catalog entry's `measured` block replaces the matching assumption (cpu: all of them).

    Where the defaults come from (none is fitted to a single published point):
    - hbm_efficiency 0.80: decode GEMV/GEMM kernels stream weights at 75-90% of peak HBM
      bandwidth (docs/design/performance-anchors.md, "Bandwidth floor").
    - tensor_efficiency 0.50: dense GEMMs with tens to hundreds of rows (decode and verify
      batches) reach 40-70% of the dense peak, FP8/FP4 ones the lower end; large prefill GEMMs do
      better, so this is conservative for prompts.
    - attention_efficiency 0.50: decode/verify attention (few queries over a long KV cache) reaches
      about half of peak bandwidth; replaced by the kernel's measured fraction (`measured.
      attention_fraction`, e.g. perf/bench_kv_inject.py's hbm_fraction on that GPU) when a GPU run
      records one.
    - nvlink_efficiency 0.70 and allreduce_latency_us 6: NCCL/custom one-shot all-reduce bus
      bandwidth reaches 60-80% of one NVLink direction; a small-message all-reduce costs a few us.
    - fabric_efficiency 0.80: NCCL over InfiniBand / RoCE reaches about 80% of the NIC's line rate
      on large messages (its latency is the catalog's fabric_latency_us).
    - layer_overhead_us 16: kernel boundaries per decoder layer per pass (12-16 kernels with launch
      gaps, ramp-up and tail under CUDA graphs, about 1 us each).
    - step_overhead_ms 0.5: the runtime's own scheduling, input preparation, CUDA-graph launch and
      sampling of one forward pass (TensorRT-LLM's Executor, the drafter engine's launch).
    - seq_overhead_us 30: per sequence per step, the runtime's own: request bookkeeping,
      sampling, detokenize and stream (TensorRT-LLM's executor loop over the requests in flight).
    - loop_overhead_us and loop_request_us: our serving loop's host time per round, fixed and per
      request in flight (admission, the policy, the round's bookkeeping, acceptance, detokenize,
      metrics, stream), which every round of the DFlash server pays on top (nothing overlaps it
      with the GPU's work): measured, LOOP_COST (project/loop_cost.json: `bench loop --record`,
      the machine it ran on beside it).
    """

    hbm_efficiency: float = 0.80
    tensor_efficiency: float = 0.50
    attention_efficiency: float = 0.50
    nvlink_efficiency: float = 0.70
    allreduce_latency_us: float = 6.0
    fabric_efficiency: float = 0.80
    layer_overhead_us: float = 16.0
    step_overhead_ms: float = 0.5
    seq_overhead_us: float = 30.0
    loop_overhead_us: float = LOOP_COST["fixed_us"]
    loop_request_us: float = LOOP_COST["per_request_us"]

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Rates:
    """The rates one projection runs with (SI units), and where they came from."""

    memory_bps: float  # weight streaming bandwidth, B/s
    attention_bps: float  # attention kernel bandwidth, B/s
    attention_flops: float  # attention kernel FLOP/s
    link_bps: float | None  # all-reduce bus bandwidth (one direction x efficiency), B/s
    allreduce_latency_s: float
    fabric_bps: float | None  # inter-node all-reduce bandwidth per GPU (x efficiency), B/s
    fabric_latency_s: float | None
    domain: int  # GPUs on one NVLink domain
    layer_s: float
    step_s: float
    seq_s: float
    loop_s: float
    loop_request_s: float
    tensor: dict[str, float]  # GEMM input format -> FLOP/s
    source: str

    def gemm_flops(self, fmt: str) -> float:
        if fmt not in self.tensor:
            raise UserError(f"no dense tensor rate for {fmt} GEMMs on this device ({self.source})")
        return self.tensor[fmt]


def attention_fraction_from_bench(path, gpu: str) -> float:
    """The attention kernel's achieved fraction of peak HBM bandwidth from the JSON line that
    perf/bench_kv_inject.py prints on a GPU (median hbm_fraction over its rows); it must have been
    measured on the recipe's GPU."""
    import json
    import statistics
    from pathlib import Path

    try:
        lines = [ln for ln in Path(path).read_text().splitlines() if ln.lstrip().startswith("{")]
        data = json.loads(lines[-1]) if lines else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"--attention-bench {path}: not the JSON bench_kv_inject.py prints "
                        f"({type(e).__name__})") from None
    if not isinstance(data, dict) or data.get("bench") != "kv_inject_attention":
        raise UserError(f"--attention-bench {path}: no kv_inject_attention JSON line (python -m "
                        "trtllm_dflash.perf.bench_kv_inject --hardware GPU prints one)")
    if data.get("skipped"):
        raise UserError(f"--attention-bench {path}: the benchmark was skipped there ({data['skipped']})")
    if data.get("hardware") != gpu:
        raise UserError(f"--attention-bench {path}: measured on {data.get('hardware')!r}, the recipe runs on {gpu!r}")
    fractions = [r["hbm_fraction"] for r in data.get("rows", []) if 0 < r.get("hbm_fraction", 0) <= 1]
    if not fractions:
        raise UserError(f"--attention-bench {path}: no row with an hbm_fraction in (0, 1]")
    return statistics.median(fractions)


def rates_for(gpu: GpuSpec, a: Assumptions) -> Rates:
    """Catalog peaks x assumed efficiencies, with the entry's measured values taking precedence."""
    m = gpu.measured
    if m is not None and m.memory_bandwidth_gbs:
        mem = m.memory_bandwidth_gbs * 1e9
        att_base = mem
    elif gpu.hbm_bandwidth_tbs:
        mem = gpu.hbm_bandwidth_tbs * 1e12 * a.hbm_efficiency
        att_base = gpu.hbm_bandwidth_tbs * 1e12
    else:
        raise UserError(f"hardware {gpu.name}: no memory bandwidth in the catalog and none measured "
                        f"(calibrate it: trtllm-dflash project RECIPE --calibrate)")
    att_fraction = (m.attention_fraction if m and m.attention_fraction else None)
    if m is not None and m.tensor_gflops:
        tensor = {f: m.tensor_gflops * 1e9 for f in ("fp32", "bf16", "fp16", "fp8", "nvfp4", "mxfp4")}
        att_flops = m.tensor_gflops * 1e9 * (att_fraction or 1.0)
        att_bps = att_base * (att_fraction or 1.0)
    else:
        tensor = {f: gpu.dense_tflops(f) * 1e12 * a.tensor_efficiency
                  for f in ("bf16", "fp16", "fp8", "nvfp4", "mxfp4") if gpu.dense_tflops(f)}
        att_flops = (gpu.bf16_tflops or 0) * 1e12 * (att_fraction or a.attention_efficiency)
        att_bps = att_base * (att_fraction or a.attention_efficiency)
    link = gpu.nvlink_gbs / 2 * 1e9 * a.nvlink_efficiency if gpu.nvlink_gbs else None

    def pick(field: str, default: float) -> float:
        v = getattr(m, field) if m is not None else None
        return default if v is None else v

    measured = f"; measured: {m.source}" if m is not None else ""
    calibrated = m is not None and m.seq_overhead_us is not None
    return Rates(
        memory_bps=mem, attention_bps=att_bps, attention_flops=att_flops, link_bps=link,
        allreduce_latency_s=a.allreduce_latency_us * 1e-6,
        fabric_bps=gpu.fabric_gbs * 1e9 * a.fabric_efficiency if gpu.fabric_gbs else None,
        fabric_latency_s=gpu.fabric_latency_us * 1e-6 if gpu.fabric_latency_us else None, domain=gpu.domain,
        layer_s=pick("layer_overhead_us", a.layer_overhead_us) * 1e-6,
        step_s=pick("step_overhead_ms", a.step_overhead_ms) * 1e-3,
        # a calibration that measured the per-sequence cost (project --calibrate) measured the loop in it
        loop_s=0.0 if calibrated else a.loop_overhead_us * 1e-6,
        loop_request_s=0.0 if calibrated else a.loop_request_us * 1e-6,
        seq_s=pick("seq_overhead_us", a.seq_overhead_us) * 1e-6,
        tensor=tensor, source=f"catalog {gpu.name}{measured}",
    )
