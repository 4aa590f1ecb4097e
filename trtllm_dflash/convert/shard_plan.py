"""The trtllm layout's plan: every rank's output tensors in file order, from the safetensors headers
before any weight is read (which source rows / columns each rank reads, the shape it writes), and
the Transform each planned tensor goes through on its way to the file (Cast here; the quantize
stage's QuantTransform). tp is checked against every dimension it splits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import torch

from trtllm_dflash.convert.safetensors_stream import CODE_DTYPES, Checkpoint
from trtllm_dflash.convert.sources import DTYPE_NAMES, Role, Sources, expected_shapes
from trtllm_dflash.errors import UserError
from trtllm_dflash.formats.weight_maps import (
    DRAFTER_MAP,
    WEIGHT_MAPS,
    ArchMap,
    Entry,
    Heads,
    Read,
    model_entries,
    plan_reads,
    planned_shape,
)
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.plan.sharding import ModelDims, tp_message

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class PlannedTensor:
    """One output tensor of one rank, before any transform (cast / quantization)."""

    name: str
    entry: Entry
    layer: int | None
    reads: list[list[Read]]
    shape: tuple[int, ...]
    source_dtype: torch.dtype
    group: tuple[str, ...]  # source modules whose scales this tensor shares (linear entries)
    experts: int = 0


@dataclass
class ModelPlan:
    role: Role
    arch_map: ArchMap
    tp: int
    heads: Heads
    ranks: list[list[PlannedTensor]]  # per rank, in file order
    num_layers: int


class Transform(Protocol):
    """What happens to each planned tensor on its way to the file (cast, or quantize)."""

    def validate(self, plan: ModelPlan) -> None: ...
    def dtype(self, role: Role) -> torch.dtype: ...
    def outputs(self, role: Role, t: PlannedTensor) -> list[tuple[str, tuple[int, ...], torch.dtype]]: ...
    def apply(self, role: Role, t: PlannedTensor, x: torch.Tensor) -> dict[str, torch.Tensor]: ...
    def extras(self, role: Role, layer: int, rank: int) -> dict[str, torch.Tensor]: ...
    def quantization(self, role: Role) -> dict: ...
    def describe(self) -> dict: ...


class Cast:
    """No quantization: every tensor in the model's dtype (or the entry's forced dtype)."""

    def __init__(self, dtypes: dict[str, torch.dtype]):
        self.dtypes = dtypes  # role -> dtype

    def validate(self, plan: ModelPlan) -> None:
        pass

    def dtype(self, role: Role) -> torch.dtype:
        return self.dtypes[role]

    def _dtype(self, role: Role, t: PlannedTensor) -> torch.dtype:
        return getattr(torch, t.entry.dtype) if t.entry.dtype else self.dtypes[role]

    def outputs(self, role, t):
        return [(t.name, t.shape, self._dtype(role, t))]

    def apply(self, role, t, x):
        return {t.name: x.to(self._dtype(role, t))}

    def extras(self, role, layer, rank):
        return {}

    def quantization(self, role):
        return {"quant_algo": None, "kv_cache_quant_algo": None}

    def describe(self):
        return {"transform": "cast", "dtypes": {k: DTYPE_NAMES[v] for k, v in self.dtypes.items()}}


def default_dtypes(recipe: Recipe) -> dict[str, torch.dtype]:
    """Unquantized tensors keep each model's checkpoint dtype (Quantization.checkpoint_dtype)."""
    q = recipe.quantization
    return {role: TORCH_DTYPES[q.checkpoint_dtype(role)] for role in ("target", "drafter")}


def check_tp(tp: int, t, d, drafter_tp: int | None = None) -> None:
    """tp against every dimension it splits in the target, and drafter_tp (default tp; 1 when rank
    0 holds the whole drafter) in the drafter, read from their config.json (the recipe rules'
    definition: recipe/plan/sharding.py, our converter's layout)."""
    target = ModelDims("target", t.num_heads, t.num_kv_heads,
                       t.intermediate_size if t.moe is None or not all(t.moe.sparse_layers) else 0, t.vocab_size,
                       num_experts=t.moe.num_experts if t.moe else 0,
                       moe_intermediate_size=t.moe.intermediate_size if t.moe else 0)
    # The drafter checkpoint holds its own copy of the target's embedding and LM head rows.
    drafter = ModelDims("drafter", d.num_heads, d.num_kv_heads, d.intermediate_size, t.vocab_size, fc_out=d.hidden_size)
    for models, n in (([target], tp), ([drafter], tp if drafter_tp is None else drafter_tp)):
        why = tp_message(models, n, "engine")
        if why:
            raise UserError(f"parallel.tp: {why}")


def _module(name: str) -> str:
    return name.rsplit(".", 1)[0]


def _plan_model(
    role: Role,
    arch_map: ArchMap,
    cfg,
    tp: int,
    sources: dict[str, Checkpoint],
    tied_lm_head: bool,
) -> list[list[PlannedTensor]]:
    """Every rank's output tensors, in file order."""
    shapes = {n: i.shape for c in sources.values() for n, i in c.tensors.items()}
    dtypes = {n: CODE_DTYPES[i.dtype] for c in sources.values() for n, i in c.tensors.items()}
    heads = Heads(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    moe = getattr(cfg, "moe", None)
    entries = model_entries(arch_map, cfg, drafter=role == "drafter")
    ranks = []
    for rank in range(tp):
        planned = []
        for entry, layer in entries:
            if tied_lm_head and entry.src == ("lm_head.weight",):
                entry = dataclasses.replace(entry, src=("model.embed_tokens.weight",))
            experts = moe.num_experts if (moe is not None and entry.rule.startswith("experts_")) else 0
            reads = plan_reads(entry, layer, rank, tp, shapes, heads, experts)
            group: tuple[str, ...] = ()
            if entry.linear:
                members = [entry] if entry.share is None else [
                    e for e, at in entries if at == layer and e.share == entry.share]
                group = tuple(_module(r.name) for m in members
                              for piece in plan_reads(m, layer, 0, 1, shapes, heads, experts) for r in piece)
            planned.append(
                PlannedTensor(
                    name=entry.dst.replace("{}", str(layer)) if layer is not None else entry.dst,
                    entry=entry,
                    layer=layer,
                    reads=reads,
                    shape=planned_shape(entry, reads, shapes),
                    source_dtype=dtypes[reads[0][0].name],
                    group=group,
                    experts=experts,
                )
            )
        ranks.append(planned)
    return ranks


def plan_trtllm(src: Sources, tp: int, drafter_tp: int | None = None) -> dict[Role, ModelPlan]:
    """Both models' per-rank plans: the target split over `tp` ranks, the drafter over
    `drafter_tp` (default tp; 1 where rank 0 holds the whole drafter: recipe/plan/drafter.py
    drafter_placement, whose `.tp` every caller passes)."""
    t, d = src.target_cfg, src.drafter_cfg
    dtp = tp if drafter_tp is None else drafter_tp
    check_tp(tp, t, d, dtp)
    arch_map = WEIGHT_MAPS[t.arch]
    tied = t.tie_word_embeddings and "lm_head.weight" not in src.target.tensors
    plans: dict[Role, ModelPlan] = {}
    plans["target"] = ModelPlan(
        "target", arch_map, tp, Heads(t.num_heads, t.num_kv_heads, t.head_dim),
        _plan_model("target", arch_map, t, tp, {"self": src.target}, tied),
        t.num_layers,
    )
    plans["drafter"] = ModelPlan(
        "drafter", DRAFTER_MAP, dtp, Heads(d.num_heads, d.num_kv_heads, d.head_dim),
        _plan_model("drafter", DRAFTER_MAP, d, dtp, {"self": src.drafter, "target": src.target}, tied),
        d.num_layers,
    )
    for role, plan in plans.items():  # every source tensor is consumed: the map is complete
        ckpt = src.target if role == "target" else src.drafter
        used = {r.name for t_ in plan.ranks[0] for piece in t_.reads for r in piece}
        unused = sorted(set(expected_shapes(role, src.target_cfg if role == "target" else src.drafter_cfg)) - used)
        if unused:
            raise UserError(f"{role} {ckpt.directory}: the {plan.arch_map.architecture} weight map does not convert "
                            f"{', '.join(unused[:3])}")
    return plans
