"""Where the drafter runs at tp > 1: whole on rank 0 or split like the target (the one rule,
docs/engine-tp.md), and the numbers the choice is made from.

dtp is the number of ranks the drafter is split over (`drafter_placement`, the one rule): tp
when it is split like the target, 1 when rank 0 holds the whole drafter. The plan then describes
rank 0, the most loaded device, and that is the deployment's capacity: TensorRT-LLM 1.2.x gives
every rank the smallest KV-cache token count any rank can afford (kvCacheManager.cpp,
"make sure all ranks use same value for maxTokens": an MPI all-reduce MIN).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from trtllm_dflash.recipe.hardware import GiB, GpuSpec
from trtllm_dflash.recipe.plan.fit import rank_plan
from trtllm_dflash.recipe.plan.rows import HIGH_PRECISION
from trtllm_dflash.recipe.schema import Recipe
from trtllm_dflash.recipe.support import backend as backend_spec

PLACEMENTS = ("rank0", "split")


@dataclass(frozen=True)
class DrafterPlacement:
    """Where the drafter runs at tp > 1, and the numbers the choice was made from (bytes; the
    memory ones at build.max_batch_size, the exchange ones per round at that batch and a full
    block). `tp`: the ranks its weights and context cache are split over (1 for rank0)."""

    mode: str  # "rank0": the whole drafter on rank 0's GPU; "split": tensor-parallel like the target
    tp: int
    why: str
    whole_bytes: float = 0.0  # the whole drafter: weights + context cache
    split_bytes: float = 0.0  # one rank's part of it when split
    target_share_bytes: float = 0.0  # one rank's share of the target: weights + KV cache
    rank0_fits: bool = True
    exchange_rank0_bytes: float = 0.0  # what drafting adds to the cross-rank traffic of a round
    exchange_split_bytes: float = 0.0
    split_collectives: int = 0  # collectives a split drafter pass adds to a round

    def to_json(self) -> dict:
        return asdict(self)


def _exchange_split(recipe: Recipe, tp: int) -> tuple[float, int]:
    """Bytes a split drafter moves between ranks per round, per GPU, and its collectives: rank 0
    broadcasts the round's inputs (new context rows, block ids and positions) to the tp - 1
    others; inside the pass every layer all-reduces twice (attention output, MLP output: ring,
    2 (tp-1)/tp of the tensor per GPU), fc's output and the vocab-parallel LM head's logits are
    all-gathered ((tp-1)/tp)."""
    d, t, b = recipe.drafter_facts, recipe.target_facts, recipe.build
    rows = b.max_batch_size * recipe.speculative.block_size  # a full block, every draft accepted
    act = rows * d.hidden_size * HIGH_PRECISION
    broadcast = (tp - 1) * (act + rows * 2 * 4)  # context rows + int32 ids and positions
    all_reduce = 2 * d.num_layers * 2 * (tp - 1) / tp * act
    drafts = recipe.speculative.block_size - 1
    gathers = (tp - 1) / tp * (act + b.max_batch_size * drafts * t.vocab_size * HIGH_PRECISION)
    return broadcast + all_reduce + gathers, 1 + 2 * d.num_layers + 2


def drafter_placement(recipe: Recipe, *, tp: int | None = None, gpu: GpuSpec | None = None) -> DrafterPlacement:
    """The one rule for where the drafter runs (docs/engine-tp.md).

    Only the engine backend chooses (TensorRT-LLM 1.2.x leader mode, every rank a process of
    ours): rank 0 holds the whole drafter when (a) rank 0 still fits the recipe's batch with it,
    and (b) the whole drafter (weights + context cache) is no larger than one rank's share of
    the target (weights + KV cache). (a) is hard: 1.2.x sizes every rank's KV pool by the
    tightest rank. (b) keeps rank 0 at most twice as loaded as the others, in memory and in the
    bytes its passes stream (a memory-bound drafter pass on one GPU then takes no longer than
    each rank's verify pass). Rank 0 adds nothing to a round's cross-rank traffic (the drafts
    travel inside the verify requests the Executor's leader broadcasts anyway); a split drafter
    adds a broadcast of the round's context rows and 2 collectives per layer, so ties go to
    rank 0. Otherwise the drafter is split like the target. `tp` / `gpu`: decide for another
    tp or GPU than the recipe's (the smallest-tp search).
    The reference backend's rank group splits it like the target (the oracle of the engine's
    split); the pytorch backend's drafter is TensorRT-LLM's, counted split like the target."""
    tp = tp or recipe.parallel.tp
    if tp == 1:
        return DrafterPlacement("rank0", 1, "tp 1: one GPU holds the target and the drafter")
    spec = backend_spec(recipe.backend.name)
    if spec.drafter_placement == "split":
        who = ("the reference rank group splits every module like the target" if spec.round_loop
               else "TensorRT-LLM's DFlash places its own drafter; the plan counts it split like the target")
        return DrafterPlacement("split", tp, who)
    b, gpu = recipe.build.max_batch_size, gpu or recipe.gpu
    one, split = rank_plan(recipe, tp, gpu, dtp=1), rank_plan(recipe, tp, gpu, dtp=tp)
    asked = recipe.parallel.drafter if tp == recipe.parallel.tp else "auto"
    rows = lambda p, *names: sum(r.bytes * (b if r.per_sequence else 1) for r in p.rows if r.component in names)  # noqa: E731
    whole = rows(one, "drafter weights", "drafter context cache")
    share = rows(one, "target weights", "target KV cache")
    exchange, collectives = _exchange_split(recipe, tp)
    numbers = dict(whole_bytes=whole, split_bytes=rows(split, "drafter weights", "drafter context cache"),
                   target_share_bytes=share, rank0_fits=one.fits, exchange_split_bytes=exchange,
                   split_collectives=collectives)
    gib = lambda x: f"{x / GiB:.2f} GiB"  # noqa: E731
    if asked != "auto":
        return DrafterPlacement(asked, 1 if asked == "rank0" else tp, "parallel.drafter asks for it", **numbers)
    if one.fits and whole <= share:
        why = (f"the whole drafter ({gib(whole)}) is no larger than a rank's share of the target ({gib(share)}) and "
               f"rank 0 fits {b} sequences with it; split would add {gib(exchange)} and {collectives} collectives "
               "to every round")
        return DrafterPlacement("rank0", 1, why, **numbers)
    if not one.fits:
        why = f"rank 0 cannot hold the whole drafter ({gib(whole)}) beside its share of the target at {b} sequences"
    else:
        why = f"the whole drafter ({gib(whole)}) is larger than a rank's share of the target ({gib(share)})"
    return DrafterPlacement("split", tp, why + f"; split: {gib(numbers['split_bytes'])} per rank", **numbers)
