"""The memory plan of a recipe: rank 0's rows and totals with the drafter where the one rule puts
it, and the smallest tp that fits each GPU of the catalog.

The rows and their formulas: recipe/plan/rows.py; where each is allocated and whether they fit:
recipe/plan/fit.py; where the drafter runs: recipe/plan/drafter.py; what tp must divide:
recipe/plan/sharding.py; the engine backend's engine tensors: recipe/plan/engine_memory.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trtllm_dflash.recipe.hardware import GpuSpec, hardware_catalog
from trtllm_dflash.recipe.plan.drafter import drafter_placement
from trtllm_dflash.recipe.plan.fit import MemoryPlan, rank_plan
from trtllm_dflash.recipe.plan.sharding import allowed_tps, model_dims
from trtllm_dflash.recipe.schema import Recipe


@dataclass(frozen=True)
class TpFit:
    """The smallest tp at which a recipe fits one GPU type (None: none up to max_per_node)."""

    gpu: GpuSpec
    tp: int | None
    need_bytes: float  # per rank, at `tp` (or at the largest allowed tp when none fits)
    tried: list[int]  # the tps that split both models, in the order tried
    unsupported: list[str]  # the recipe's formats this GPU does not run

    def describe(self) -> str:
        if self.tp is not None:
            return str(self.tp)
        return f"none up to {self.gpu.max_per_node} per node" if self.tried else "no tp splits the models"


def plan(recipe: Recipe, *, tp: int | None = None, gpu: GpuSpec | None = None, dtp: int | None = None) -> MemoryPlan:
    """The recipe's memory per rank, at its own tp and GPU unless `tp` / `gpu` say otherwise, with
    the drafter where drafter_placement puts it (or split over `dtp` ranks): rank 0's plan."""
    tp = tp or recipe.parallel.tp
    gpu = gpu or recipe.gpu
    dtp = dtp or drafter_placement(recipe, tp=tp, gpu=gpu).tp
    return rank_plan(recipe, tp, gpu, dtp)


def gpu_types() -> list[GpuSpec]:
    """The GPUs of the hardware catalog (every entry but cpu), in catalog order."""
    return [g for g in hardware_catalog().values() if not g.is_cpu]


def smallest_tp(recipe: Recipe, gpu: GpuSpec) -> TpFit:
    """The least tp (up to the GPU's max_per_node) that splits both models and fits `gpu`, at the
    recipe's formats, max_batch_size and max_seq_len. Formats `gpu` cannot run are reported, not
    substituted: the answer is then about memory only."""
    tried = allowed_tps(model_dims(recipe), recipe.backend.name, gpu.max_per_node)
    unsupported = sorted({f for f in recipe.quantization.formats.values() if not gpu.supports(f)})
    need = math.inf
    for tp in tried:
        p = plan(recipe, tp=tp, gpu=gpu)
        need = p.need_bytes
        if p.fits:
            return TpFit(gpu, tp, need, tried, unsupported)
    return TpFit(gpu, None, need, tried, unsupported)
