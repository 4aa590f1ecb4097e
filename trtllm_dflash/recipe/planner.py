"""Memory planner: what one device holds for a recipe, and the concurrency that fits.

Per device (tp ranks share every weight matrix and every KV head evenly; KV heads are
replicated when tp > num_kv_heads):

    target weights  = (linear_params * bytes(target_weights) + embed/lm_head params * 2) / tp
    drafter weights = drafter linear_params * bytes(drafter) / dtp
                      (+ 2 * vocab * hidden * 2 / dtp on the engine backend, whose drafter engine
                      holds its own copies of the target's embedding and LM head; the other
                      backends' drafters share the target's)
    target KV / seq = sum over layers of tokens(layer) * 2 * ceil(n_kv / tp) * head_dim * bytes(kv_cache)
                      tokens = max_seq_len + block_size (the verify block is written before the trim),
                      capped at sliding_window + block_size on sliding-window layers
    draft ctx / seq = drafter layers * (max_seq_len + block_size) * 2 * ceil(n_kv_d / dtp) * head_dim_d
                      * bytes(context cache); the pytorch backend keeps it in BF16 and allocates one
                      extra (dummy) slot
    logits / seq    = block_size * vocab / tp * 4 (fp32 verify logits)
    activations     = max_num_tokens * (n_target_layers * hidden * 2      # captured target features, bf16
                                        + (4 * hidden + 2 * ffn / tp) * 2) # transient GEMM outputs, bf16
    runtime reserve = 2 GiB per GPU (CUDA context, cuBLAS / NCCL workspaces); 1 GiB on cpu
    capacity        = device memory * 0.95 (allocator fragmentation)

fits iff weights + activations + reserve + max_batch_size * (KV + ctx + logits) <= capacity;
max_concurrency = floor((capacity - fixed) / per-sequence bytes).

dtp is the number of ranks the drafter is split over (`drafter_placement`, the one rule): tp
when it is split like the target, 1 when rank 0 holds the whole drafter. The plan then describes
rank 0, the most loaded device, and that is the deployment's capacity: TensorRT-LLM 1.2.x gives
every rank the smallest KV-cache token count any rank can afford (kvCacheManager.cpp,
"make sure all ranks use same value for maxTokens": an MPI all-reduce MIN).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from trtllm_dflash.recipe.hardware import BYTES_PER_ELEMENT, GiB
from trtllm_dflash.recipe.models import ArchFacts
from trtllm_dflash.recipe.schema import Recipe

CAPACITY_FRACTION = 0.95
GPU_RUNTIME_RESERVE = 2 * GiB
CPU_RUNTIME_RESERVE = 1 * GiB
HIGH_PRECISION = 2.0  # bytes: embeddings, LM head, norms and activations stay BF16


@dataclass(frozen=True)
class PlanRow:
    component: str
    bytes: float
    per_sequence: bool
    formula: str

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
    capacity_bytes: float
    fixed_bytes: float
    per_sequence_bytes: float
    total_bytes: float
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

    def to_json(self) -> dict:
        d = asdict(self)
        d["rows"] = [dict(asdict(r), gib=round(r.gib, 4)) for r in self.rows]
        d["total_gib"] = round(self.total_gib, 4)
        d["capacity_gib"] = round(self.capacity_gib, 4)
        return d


def kv_heads_per_rank(n_kv: int, tp: int) -> int:
    return max(1, math.ceil(n_kv / tp))


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
    kv = recipe.quantization.kv_cache
    if recipe.backend.name == "pytorch":
        return "bf16"  # TensorRT-LLM's DFlash keeps it in the drafter fc dtype (BF16)
    if recipe.backend.name == "engine":
        return "fp8" if kv in ("fp8", "nvfp4") else "bf16"  # our kernel reads BF16/FP16 or FP8
    return kv


def drafter_weight_bytes(recipe: Recipe, dtp: int) -> float:
    """One rank's drafter weights when the drafter is split over `dtp` ranks. The engine backend's
    drafter engine carries its own copies of the target's embedding and LM head (convert's
    DRAFTER_MAP reads both from the target: the engine cannot reach the target engine's);
    the other backends' drafters share the target's."""
    d, t = recipe.drafter_facts, recipe.target_facts
    linear = d.linear_params * BYTES_PER_ELEMENT[recipe.quantization.drafter]
    copies = 2 * t.vocab_size * t.hidden_size * HIGH_PRECISION if recipe.backend.name == "engine" else 0.0
    return (linear + copies) / dtp


def _weight_read(recipe: Recipe) -> tuple[float, float | None]:
    """Batch-1 decode reads every active target weight once per step (plus the LM head): bytes per
    device, and the HBM floor in ms (None without a bandwidth in the catalog)."""
    t, gpu, tp = recipe.target_facts, recipe.gpu, recipe.parallel.tp
    active_linear = t.active_params - t.embedding_params
    head = t.vocab_size * t.hidden_size * HIGH_PRECISION
    read = (active_linear * BYTES_PER_ELEMENT[recipe.quantization.target_weights] + head) / tp
    return read, read / (gpu.hbm_bandwidth_tbs * 1e12) * 1e3 if gpu.hbm_bandwidth_tbs else None


def _plan(recipe: Recipe, dtp: int) -> MemoryPlan:
    """The plan of one device with the drafter split over `dtp` ranks (dtp = 1 at tp > 1: rank 0,
    which holds the whole drafter)."""
    t, d, gpu = recipe.target_facts, recipe.drafter_facts, recipe.gpu
    q, b, tp = recipe.quantization, recipe.build, recipe.parallel.tp
    block = recipe.speculative.block_size
    wbytes, kvbytes = BYTES_PER_ELEMENT[q.target_weights], BYTES_PER_ELEMENT[q.kv_cache]
    ctx_fmt = context_cache_format(recipe)
    ffn = t.intermediate_size if not t.is_moe else t.experts_per_token * t.moe_intermediate_size
    n_feat = len(d.target_layer_ids or [])

    target_w = (t.linear_params * wbytes + t.embedding_params * HIGH_PRECISION) / tp
    activations = b.max_num_tokens * (n_feat * t.hidden_size * HIGH_PRECISION + (4 * t.hidden_size + 2 * ffn / tp) * HIGH_PRECISION)
    reserve = CPU_RUNTIME_RESERVE if gpu.is_cpu else GPU_RUNTIME_RESERVE
    kv = target_kv_bytes_per_seq(t, tp, b.max_seq_len, block, kvbytes)
    ctx = drafter_ctx_bytes_per_seq(d, dtp, b.max_seq_len, block, BYTES_PER_ELEMENT[ctx_fmt])
    logits = block * t.vocab_size / tp * 4
    dummy_slot = ctx if recipe.backend.name == "pytorch" else 0.0
    where = ", all of it on rank 0" if dtp < tp else (", / tp" if tp > 1 else "")
    copies = " + embed/head copies x bf16" if recipe.backend.name == "engine" else ""

    rows = [
        PlanRow("target weights", target_w, False, f"{t.linear_params / 1e9:.2f}B linear x {q.target_weights} + {t.embedding_params / 1e9:.2f}B embed/head x bf16, / tp"),
        PlanRow("drafter weights", drafter_weight_bytes(recipe, dtp), False, f"{d.linear_params / 1e9:.3f}B x {q.drafter}{copies}{where}"),
        PlanRow("activations", activations, False, f"max_num_tokens {b.max_num_tokens} x ({n_feat} captured features + GEMM outputs)"),
        PlanRow("runtime reserve", reserve, False, "CUDA context, cuBLAS/NCCL workspaces" if not gpu.is_cpu else "Python + torch"),
        PlanRow("target KV cache", kv, True, f"{t.num_layers} layers x {b.max_seq_len}+{block} tokens x {kv_heads_per_rank(t.num_kv_heads, tp)} KV heads x {t.head_dim} x {q.kv_cache}"),
        PlanRow("drafter context cache", ctx, True, f"{d.num_layers} layers x {b.max_seq_len}+{block} tokens x {kv_heads_per_rank(d.num_kv_heads, dtp)} KV heads x {d.head_dim} x {ctx_fmt}"),
        PlanRow("verify logits", logits, True, f"{block} x vocab {t.vocab_size} / tp x fp32"),
    ]
    if dummy_slot:
        rows.insert(4, PlanRow("drafter dummy slot", dummy_slot, False, "TensorRT-LLM DFlash arena has max_batch_size+1 slots"))
    fixed = sum(r.bytes for r in rows if not r.per_sequence)
    per_seq = sum(r.bytes for r in rows if r.per_sequence)
    capacity = gpu.memory_bytes * CAPACITY_FRACTION
    total = fixed + b.max_batch_size * per_seq

    read, floor_ms = _weight_read(recipe)
    return MemoryPlan(  # (alike only in form to train/tokenizer.py's keyword list: unrelated)
        recipe=recipe.name,
        device=gpu.name,
        devices=recipe.hardware.count,
        tp=tp,
        max_batch_size=b.max_batch_size,
        rows=rows,
        capacity_bytes=capacity,
        fixed_bytes=fixed,
        per_sequence_bytes=per_seq,
        total_bytes=total,
        max_concurrency=max(0, math.floor((capacity - fixed) / per_seq)),
        fits=total <= capacity,
        weights_read_per_step_bytes=read,
        bandwidth_floor_ms=floor_ms,
        drafter_tp=dtp,
    )


def plan(recipe: Recipe) -> MemoryPlan:
    """What one device holds for `recipe`, with the drafter where drafter_placement puts it."""
    return _plan(recipe, drafter_placement(recipe).tp)


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


def drafter_placement(recipe: Recipe) -> DrafterPlacement:
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
    rank 0. Otherwise the drafter is split like the target.
    The reference backend's rank group splits it like the target (the oracle of the engine's
    split); the pytorch backend's drafter is TensorRT-LLM's, counted split like the target."""
    tp = recipe.parallel.tp
    if tp == 1:
        return DrafterPlacement("rank0", 1, "tp 1: one GPU holds the target and the drafter")
    if recipe.backend.name != "engine":
        who = ("the reference rank group splits every module like the target" if recipe.backend.name == "reference"
               else "TensorRT-LLM's DFlash places its own drafter; the plan counts it split like the target")
        return DrafterPlacement("split", tp, who)
    b = recipe.build.max_batch_size
    one, split = _plan(recipe, 1), _plan(recipe, tp)
    rows = lambda p, *names: sum(r.bytes * (b if r.per_sequence else 1) for r in p.rows if r.component in names)  # noqa: E731
    whole = rows(one, "drafter weights", "drafter context cache")
    share = rows(one, "target weights", "target KV cache")
    exchange, collectives = _exchange_split(recipe, tp)
    numbers = dict(whole_bytes=whole, split_bytes=rows(split, "drafter weights", "drafter context cache"),
                   target_share_bytes=share, rank0_fits=one.fits, exchange_split_bytes=exchange,
                   split_collectives=collectives)
    gib = lambda x: f"{x / GiB:.2f} GiB"  # noqa: E731
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
