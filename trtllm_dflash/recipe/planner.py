"""Memory planner: what one rank holds for a recipe, whether that fits its GPU, the largest
concurrency that does, and the smallest tp that fits on each GPU of the catalog.

Per rank (how tp splits each dimension, and the vocabulary rows a rank holds: recipe/sharding.py):

    target weights  = linear_params * bytes(target_weights) / tp + embedding and LM head rows * hidden * 2
    drafter weights = drafter layers * bytes(drafter) / dtp, plus its fc (n_captured * hidden^2):
                      split by our converter (engine, reference), replicated by TensorRT-LLM's DFlash
                      (pytorch); the engine backend's drafter engine also holds its own BF16 copy of the
                      target's embedding and LM head rows (formats/weight_maps.py DRAFTER_MAP), the
                      other backends' drafters use the target's
    activations     = max_num_tokens * (n_captured * hidden * 2       # captured target features, bf16
                                        + (4 * hidden + 2 * ffn / tp) * 2)  # transient GEMM outputs, bf16
    runtime reserve = 2 GiB per GPU (CUDA context, cuBLAS / NCCL workspaces); 1 GiB on cpu
    verify logits   = block_size * vocab rows * 4 per sequence (fp32); the engine backend counts its
                      engines' tensors instead (target output buffers, verify logits and their
                      output, drafter engine activations and I/O, verify recompute:
                      recipe/engine_memory.py, checked against plan.json's tensors)
    target KV / seq = sum over layers of tokens(layer) * 2 * kv_heads_per_rank * head_dim * bytes(kv_cache)
                      tokens = max_seq_len + block_size (the verify block is written before the trim),
                      capped at sliding_window + block_size on sliding-window layers
    draft ctx / seq = drafter layers * (max_seq_len + block_size) * 2 * kv_heads_per_rank(dtp) * head_dim
                      * bytes(context cache); the pytorch backend keeps it in BF16 and allocates one
                      extra (dummy) slot; the drafter engine's arena holds max_seq_len + max_draft_len

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
`smallest_tp` = the least tp that splits both models (sharding.py) and fits.

dtp is the number of ranks the drafter is split over (`drafter_placement`, the one rule): tp
when it is split like the target, 1 when rank 0 holds the whole drafter. The plan then describes
rank 0, the most loaded device, and that is the deployment's capacity: TensorRT-LLM 1.2.x gives
every rank the smallest KV-cache token count any rank can afford (kvCacheManager.cpp,
"make sure all ranks use same value for maxTokens": an MPI all-reduce MIN).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal, get_args

from trtllm_dflash.recipe import engine_memory as em
from trtllm_dflash.recipe.engine_layout import max_draft_len, target_seq_len
from trtllm_dflash.recipe.hardware import BYTES_PER_ELEMENT, GiB, GpuSpec, hardware_catalog
from trtllm_dflash.recipe.models import ArchFacts
from trtllm_dflash.recipe.support import backend as backend_spec
from trtllm_dflash.recipe.schema import Recipe
from trtllm_dflash.recipe.sharding import (
    OUR_CONVERTER,
    ModelDims,
    allowed_tps,
    kv_heads_per_rank,
    vocab_rows_per_rank,
)

# The free-memory fraction every GPU deployment we write gives the target's KV cache: deploy
# writes it into the pytorch backend's kv_cache_config.free_gpu_memory_fraction and the engine
# backend's kv_cache_free_gpu_mem_fraction (the 1.2.1 Executor's KvCacheConfig), serve reads it
# back. Below TensorRT-LLM's 0.9 default: the DFlash context arena is allocated from what the
# pool leaves.
KV_CACHE_FREE_GPU_MEM_FRACTION = 0.8
GPU_RUNTIME_RESERVE = 2 * GiB
CPU_RUNTIME_RESERVE = 1 * GiB
HIGH_PRECISION = 2.0  # bytes: embeddings, LM head, norms and activations stay BF16

Where = Literal["start-up", "KV pool", "after pool", "on demand"]  # "on demand": no pool (reference)


@dataclass(frozen=True)
class PlanRow:
    component: str
    bytes: float  # per rank; per sequence when per_sequence
    per_sequence: bool
    formula: str
    where: Where = "start-up"

    @property
    def gib(self) -> float:
        return self.bytes / GiB


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


def target_kv_bytes_per_seq(t: ArchFacts, tp: int, max_seq_len: int, block_size: int, kv_bytes: float) -> float:
    tokens_full = max_seq_len + block_size
    tokens_sliding = min(tokens_full, (t.sliding_window or tokens_full) + block_size)
    n_full = t.num_layers - t.sliding_layers
    per_token_per_layer = 2 * kv_heads_per_rank(t.num_kv_heads, tp) * t.head_dim * kv_bytes
    return (n_full * tokens_full + t.sliding_layers * tokens_sliding) * per_token_per_layer


def drafter_ctx_bytes_per_seq(d: ArchFacts, tp: int, max_seq_len: int, block_size: int, ctx_bytes: float) -> float:
    return d.num_layers * (max_seq_len + block_size) * 2 * kv_heads_per_rank(d.num_kv_heads, tp) * d.head_dim * ctx_bytes


def context_cache_format(recipe: Recipe) -> str:
    """Format of the drafter's context (injected K/V) cache."""
    kv, rule = recipe.quantization.kv_cache, backend_spec(recipe.backend.name).context_cache
    if rule == "bf16":
        return "bf16"  # TensorRT-LLM's DFlash keeps it in the drafter fc dtype (BF16)
    if rule == "fp8-or-checkpoint":  # the drafter engine's arena (engines/build_config.py kv_dtype): FP8 or the model dtype
        return "fp8" if kv == "fp8" else recipe.quantization.checkpoint_dtype("drafter")
    return kv


def kv_fraction(backend: str) -> float | None:
    """The fraction of free memory the KV pool takes (None: a backend without TensorRT-LLM's pool)."""
    return KV_CACHE_FREE_GPU_MEM_FRACTION if backend_spec(backend).kv_pool else None


def model_dims(recipe: Recipe) -> list[ModelDims]:
    return [ModelDims.of("target", recipe.target_facts), ModelDims.of("drafter", recipe.drafter_facts)]


def _weight_rows(recipe: Recipe, tp: int, dtp: int) -> list[PlanRow]:
    t, d, q, backend = recipe.target_facts, recipe.drafter_facts, recipe.quantization, recipe.backend.name
    rows = vocab_rows_per_rank(t.vocab_size, tp)
    tables = 1 if t.tie_word_embeddings else 2  # embedding and LM head
    embed = tables * rows * t.hidden_size * HIGH_PRECISION
    fc = len(d.target_layer_ids or []) * d.hidden_size ** 2
    fc_split = backend in OUR_CONVERTER
    drafter = (d.linear_params - fc) * BYTES_PER_ELEMENT[q.drafter] / dtp
    drafter += fc * BYTES_PER_ELEMENT[q.drafter] / (dtp if fc_split else 1)
    own_head = backend_spec(backend).drafter_head  # the drafter engine embeds its block and picks its drafts itself
    drafter += tables * vocab_rows_per_rank(t.vocab_size, dtp) * t.hidden_size * HIGH_PRECISION if own_head else 0.0
    split = "/ dtp" if dtp > 1 else ("whole, on rank 0" if tp > 1 else "")
    placement = f"layers and fc {split}" if fc_split else f"layers {split}, fc replicated"
    placement = placement.replace("  ", " ").strip()
    placement += " + its own embed/head copy x bf16" if own_head else ""
    return [
        PlanRow("target weights", t.linear_params * BYTES_PER_ELEMENT[q.target_weights] / tp + embed,
                False, f"{t.linear_params / 1e9:.2f}B linear x {q.target_weights} / tp + {tables} x {rows} "
                f"vocab rows x bf16"),
        PlanRow("drafter weights", drafter, False, f"{d.linear_params / 1e9:.3f}B x {q.drafter}: {placement}"),
    ]


def _rows(recipe: Recipe, tp: int, gpu: GpuSpec, dtp: int) -> list[PlanRow]:
    t, d, b = recipe.target_facts, recipe.drafter_facts, recipe.build
    q, block, backend = recipe.quantization, recipe.speculative.block_size, recipe.backend.name
    engines = backend_spec(backend).builds_engines
    ffn = t.intermediate_size if not t.is_moe else t.experts_per_token * t.moe_intermediate_size
    n_feat = len(d.target_layer_ids or [])
    ctx_fmt = context_cache_format(recipe)
    act = b.max_num_tokens * (n_feat * t.hidden_size + 4 * t.hidden_size + 2 * ffn / tp) * HIGH_PRECISION
    reserve = CPU_RUNTIME_RESERVE if gpu.is_cpu else GPU_RUNTIME_RESERVE
    kv = target_kv_bytes_per_seq(t, tp, b.max_seq_len, block, BYTES_PER_ELEMENT[q.kv_cache])
    arena_tokens = target_seq_len(recipe) if engines else b.max_seq_len + block  # the drafter engine's max_seq_len
    ctx = drafter_ctx_bytes_per_seq(d, dtp, arena_tokens - block, block, BYTES_PER_ELEMENT[ctx_fmt])
    vocab = vocab_rows_per_rank(t.vocab_size, tp)
    tokens = f"{b.max_seq_len}+{block} tokens"
    pool, after = ("KV pool", "after pool") if kv_fraction(backend) else ("on demand", "on demand")
    rows = _weight_rows(recipe, tp, dtp) + [
        PlanRow("activations", act, False, f"max_num_tokens {b.max_num_tokens} x ({n_feat} captured features + "
                "GEMM outputs)"),
        PlanRow("runtime reserve", reserve, False, "Python + torch" if gpu.is_cpu else
                "CUDA context, cuBLAS/NCCL workspaces"),
        *(_engine_rows(recipe, tp, dtp) if engines else
          [PlanRow("verify logits", block * vocab * 4, True, f"{block} x {vocab} vocab rows x fp32")]),
        PlanRow("target KV cache", kv, True, f"{t.num_layers} layers x {tokens} x "
                f"{kv_heads_per_rank(t.num_kv_heads, tp)} KV heads x {t.head_dim} x {q.kv_cache}", pool),
        PlanRow("drafter context cache", ctx, True, f"{d.num_layers} layers x {arena_tokens} tokens x "
                f"{kv_heads_per_rank(d.num_kv_heads, dtp)} KV heads x {d.head_dim} x {ctx_fmt}", after),
    ]
    if backend_spec(backend).drafter_dummy_slot:
        rows.append(PlanRow("drafter dummy slot", ctx, False, "TensorRT-LLM DFlash arena has max_batch_size+1 slots",
                            after))
    return rows


def _engine_rows(recipe: Recipe, tp: int, dtp: int) -> list[PlanRow]:
    """The engine backend's engine tensors beyond weights and caches (recipe/engine_memory.py)."""
    b, t, draft = recipe.build, recipe.target_facts, max_draft_len(recipe)
    n, B, T, C, V = b.max_num_tokens, b.max_batch_size, draft + 1, b.max_input_len, t.vocab_size
    gather = f" + tp slice and all-gather (tp {tp})" if tp > 1 else ""
    rows = [
        PlanRow("target output buffers", em.target_output_buffers(recipe), False,
                f"Executor: logits {B} x {V} fp32 + {n} tokens x ({', '.join(em.EXECUTOR_OUTPUTS)}) rows"),
        PlanRow("verify logits", em.verify_logit_activations(recipe, tp), False,
                f"{B} x {T} tail rows x {V} vocab x bf16 before the fp32 cast{gather}"),
        PlanRow("verify logits output", em.verify_logits_output_per_seq(recipe), True,
                f"dflash_logits {T} x {V} x fp32, unregistered: a buffer per step", "after pool"),
        PlanRow("drafter engine activations", em.drafter_activations(recipe, dtp), False,
                f"profile max: {B} x ({C} context rows + {T}-token block) per layer + {B} x {T - 1} x {V} logits"),
        PlanRow("drafter engine I/O", em.drafter_io_per_seq(recipe), True,
                f"ctx_rows {C} x {recipe.drafter_facts.hidden_size} + draft_logits {T - 1} x {V}", "after pool"),
    ]
    if em.recomputes(recipe):
        rows.append(PlanRow("verify recompute", 0.0, False, "re-prefills every round: activations already sized "
                            f"for {n} tokens, no per-token verify outputs; costs time, not memory"))
    return rows


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


def plan(recipe: Recipe, *, tp: int | None = None, gpu: GpuSpec | None = None, dtp: int | None = None) -> MemoryPlan:
    """The recipe's memory per rank, at its own tp and GPU unless `tp` / `gpu` say otherwise, with
    the drafter where drafter_placement puts it (or split over `dtp` ranks): rank 0's plan."""
    tp = tp or recipe.parallel.tp
    gpu = gpu or recipe.gpu
    dtp = dtp or drafter_placement(recipe, tp=tp, gpu=gpu).tp
    b, fraction = recipe.build, kv_fraction(recipe.backend.name)
    rows = _rows(recipe, tp, gpu, dtp)
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
        max_concurrency=_max_batch(lambda n: _rows(_at_batch(recipe, n), tp, gpu, dtp), fraction, capacity),
        fits=need <= capacity,
        weights_read_per_step_bytes=read, bandwidth_floor_ms=floor_ms, drafter_tp=dtp,
    )


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


# ----------------------------------------------------------------------------- drafter placement

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
    gathers = (tp - 1) / tp * (act + b.max_batch_size * (recipe.speculative.block_size - 1) * t.vocab_size * HIGH_PRECISION)
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
    b = recipe.build.max_batch_size
    one, split = plan(recipe, tp=tp, gpu=gpu, dtp=1), plan(recipe, tp=tp, gpu=gpu, dtp=tp)
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
