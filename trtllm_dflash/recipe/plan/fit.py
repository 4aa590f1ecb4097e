"""Whether one rank's rows (recipe/plan/rows.py) fit its GPU: where each is allocated, the least
memory they need, and the largest concurrency that fits.

Where each lives, in the order TensorRT-LLM allocates at start-up (both GPU backends): weights,
activations, runtime buffers and the verify logits first ("start-up", S); then the KV cache
manager takes the fraction f = KV_CACHE_FREE_GPU_MEM_FRACTION of the memory still free ("KV pool":
the target KV cache); the drafter's context arena is allocated after that, from what the pool
left ("after pool"). That order is TensorRT-LLM's DFlash arena (its warning that the arena lands
after the KV cache manager has carved its pool; docs/design/upstream-facts.md;
an arena sized for max_batch_size x max_seq_len that does not fit there starves admission or
fails to allocate: https://github.com/NVIDIA/TensorRT-LLM/issues/16005, open. `check` refuses such
a recipe before launch instead: the "after pool" term below)
and our engine backend's (runtime/trt_runners.py open_trt_engine: the drafter engine loads before
the Executor carves its pool; the arenas are made per decoder afterwards). With M the GPU's memory
(hardware catalog):

    fits  iff  target KV <= f * (M - S)  and  drafter arena <= (1 - f) * (M - S)
    need  =  S + max(target KV / f, drafter arena / (1 - f))       the least M on which it fits

The reference backend has no pool (torch allocates on demand): need = S + KV + arena. The runtime
reserve is the allocator's slack there. max_concurrency = the largest max_batch_size whose need
fits M (with the engine backend's start-up rows recomputed for engines built for that batch);
`smallest_tp` (recipe/plan/planner.py) = the least tp that splits both models (sharding.py) and fits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import get_args

from trtllm_dflash.recipe.hardware import BYTES_PER_ELEMENT, GiB, GpuSpec
from trtllm_dflash.recipe.plan.rows import HIGH_PRECISION, PlanRow, Where, kv_fraction, rank_rows
from trtllm_dflash.recipe.plan.sharding import vocab_rows_per_rank
from trtllm_dflash.recipe.schema import Recipe


@dataclass(frozen=True)
class MemoryPlan:
    recipe: str
    device: str
    devices: int
    tp: int
    max_batch_size: int
    rows: list[PlanRow]
    capacity_bytes: float  # the GPU's memory (hardware catalog)
    kv_fraction: float | None  # None: no KV pool (reference backend)
    fixed_bytes: float
    per_sequence_bytes: float
    total_bytes: float  # every row at max_batch_size
    need_bytes: float  # the least GPU memory this rank fits in at max_batch_size
    kv_pool_bytes: float | None  # the pool's size on this GPU: f * (M - start-up)
    max_concurrency: int
    fits: bool
    weights_read_per_step_bytes: float
    bandwidth_floor_ms: float | None
    drafter_tp: int = 1  # ranks the drafter is split over in this plan (1: the whole drafter on this device)

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GiB

    @property
    def capacity_gib(self) -> float:
        return self.capacity_bytes / GiB

    @property
    def need_gib(self) -> float:
        return self.need_bytes / GiB

    def to_json(self) -> dict:
        d = asdict(self)
        d["rows"] = [dict(asdict(r), gib=round(r.gib, 4)) for r in self.rows]
        d.update(total_gib=round(self.total_gib, 4), capacity_gib=round(self.capacity_gib, 4),
                 need_gib=round(self.need_gib, 4))
        return d


def _by_where(rows: list[PlanRow], batch: int) -> dict[str, float]:
    """Bytes of each allocation (start-up, KV pool, after pool) at `batch` sequences."""
    return {w: sum(r.bytes * (batch if r.per_sequence else 1) for r in rows if r.where == w) for w in get_args(Where)}


def _need(rows: list[PlanRow], batch: int, fraction: float | None) -> float:
    """The least GPU memory on which `rows` fit at `batch` sequences (see the module docstring)."""
    at = _by_where(rows, batch)
    if fraction is None:
        return sum(at.values())
    return at["start-up"] + max(at["KV pool"] / fraction, at["after pool"] / (1 - fraction))


def _max_batch(rows_at, fraction: float | None, capacity: float) -> int:
    """The largest batch whose need fits `capacity`, with `rows_at(n)` the rows of engines built for
    n sequences (the engine backend's start-up rows grow with max_batch_size; need grows with the
    batch: bisection)."""
    fits = lambda n: _need(rows_at(n), n, fraction) <= capacity  # noqa: E731
    if not fits(0):
        return 0
    lo, hi = 0, 1
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _at_batch(recipe: Recipe, n: int) -> Recipe:
    """`recipe` with build.max_batch_size n (no validation: n may be 0)."""
    return recipe.model_copy(update={"build": recipe.build.model_copy(update={"max_batch_size": n})})


def _bandwidth(recipe: Recipe, tp: int, gpu: GpuSpec) -> tuple[float, float | None]:
    """Batch-1 decode reads every active weight once per step, plus the LM head."""
    t = recipe.target_facts
    active_linear = t.active_params - t.embedding_params
    head = vocab_rows_per_rank(t.vocab_size, tp) * t.hidden_size * HIGH_PRECISION
    read = active_linear * BYTES_PER_ELEMENT[recipe.quantization.target_weights] / tp + head
    floor_ms = read / (gpu.hbm_bandwidth_tbs * 1e12) * 1e3 if gpu.hbm_bandwidth_tbs else None
    return read, floor_ms


def rank_plan(recipe: Recipe, tp: int, gpu: GpuSpec, dtp: int) -> MemoryPlan:
    """Rank 0's memory at tp `tp` on `gpu` with the drafter split over `dtp` ranks (recipe/plan/planner.py
    plan: the drafter where the one rule puts it)."""
    b, fraction = recipe.build, kv_fraction(recipe.backend.name)
    rows = rank_rows(recipe, tp, gpu, dtp)
    capacity = gpu.memory_bytes
    need = _need(rows, b.max_batch_size, fraction)
    startup = _by_where(rows, b.max_batch_size)["start-up"]
    read, floor_ms = _bandwidth(recipe, tp, gpu)
    return MemoryPlan(
        recipe=recipe.name, device=gpu.name, devices=recipe.hardware.count, tp=tp, max_batch_size=b.max_batch_size,
        rows=rows, capacity_bytes=capacity, kv_fraction=fraction,
        fixed_bytes=sum(r.bytes for r in rows if not r.per_sequence),
        per_sequence_bytes=sum(r.bytes for r in rows if r.per_sequence),
        total_bytes=_need(rows, b.max_batch_size, None), need_bytes=need,
        kv_pool_bytes=None if fraction is None else max(0.0, fraction * (capacity - startup)),
        max_concurrency=_max_batch(lambda n: rank_rows(_at_batch(recipe, n), tp, gpu, dtp), fraction, capacity),
        fits=need <= capacity,
        weights_read_per_step_bytes=read, bandwidth_floor_ms=floor_ms, drafter_tp=dtp,
    )
