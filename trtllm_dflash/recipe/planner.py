"""Memory planner: what one device holds for a recipe, and the concurrency that fits.

Per device (tp ranks share every weight matrix and every KV head evenly; KV heads are
replicated when tp > num_kv_heads):

    target weights  = (linear_params * bytes(target_weights) + embed/lm_head params * 2) / tp
    drafter weights = drafter linear_params * bytes(drafter) / tp
                      (the drafter shares the target's embedding and LM head)
    target KV / seq = sum over layers of tokens(layer) * 2 * ceil(n_kv / tp) * head_dim * bytes(kv_cache)
                      tokens = max_seq_len + block_size (the verify block is written before the trim),
                      capped at sliding_window + block_size on sliding-window layers
    draft ctx / seq = drafter layers * (max_seq_len + block_size) * 2 * ceil(n_kv_d / tp) * head_dim_d
                      * bytes(context cache); the pytorch backend keeps it in BF16 and allocates one
                      extra (dummy) slot
    logits / seq    = block_size * vocab / tp * 4 (fp32 verify logits)
    activations     = max_num_tokens * (n_target_layers * hidden * 2      # captured target features, bf16
                                        + (4 * hidden + 2 * ffn / tp) * 2) # transient GEMM outputs, bf16
    runtime reserve = 2 GiB per GPU (CUDA context, cuBLAS / NCCL workspaces); 1 GiB on cpu
    capacity        = device memory * 0.95 (allocator fragmentation)

fits iff weights + activations + reserve + max_batch_size * (KV + ctx + logits) <= capacity;
max_concurrency = floor((capacity - fixed) / per-sequence bytes).
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


def plan(recipe: Recipe) -> MemoryPlan:
    t, d, gpu = recipe.target_facts, recipe.drafter_facts, recipe.gpu
    q, b, tp = recipe.quantization, recipe.build, recipe.parallel.tp
    block = recipe.speculative.block_size
    wbytes, dbytes = BYTES_PER_ELEMENT[q.target_weights], BYTES_PER_ELEMENT[q.drafter]
    kvbytes = BYTES_PER_ELEMENT[q.kv_cache]
    ctx_fmt = context_cache_format(recipe)
    ctxbytes = BYTES_PER_ELEMENT[ctx_fmt]
    ffn = t.intermediate_size if not t.is_moe else t.experts_per_token * t.moe_intermediate_size
    n_feat = len(d.target_layer_ids or [])

    target_w = (t.linear_params * wbytes + t.embedding_params * HIGH_PRECISION) / tp
    drafter_w = d.linear_params * dbytes / tp
    activations = b.max_num_tokens * (n_feat * t.hidden_size * HIGH_PRECISION + (4 * t.hidden_size + 2 * ffn / tp) * HIGH_PRECISION)
    reserve = CPU_RUNTIME_RESERVE if gpu.is_cpu else GPU_RUNTIME_RESERVE
    kv = target_kv_bytes_per_seq(t, tp, b.max_seq_len, block, kvbytes)
    ctx = drafter_ctx_bytes_per_seq(d, tp, b.max_seq_len, block, ctxbytes)
    logits = block * t.vocab_size / tp * 4
    dummy_slot = ctx if recipe.backend.name == "pytorch" else 0.0

    rows = [
        PlanRow("target weights", target_w, False, f"{t.linear_params / 1e9:.2f}B linear x {q.target_weights} + {t.embedding_params / 1e9:.2f}B embed/head x bf16, / tp"),
        PlanRow("drafter weights", drafter_w, False, f"{d.linear_params / 1e9:.3f}B x {q.drafter}, / tp"),
        PlanRow("activations", activations, False, f"max_num_tokens {b.max_num_tokens} x ({n_feat} captured features + GEMM outputs)"),
        PlanRow("runtime reserve", reserve, False, "CUDA context, cuBLAS/NCCL workspaces" if not gpu.is_cpu else "Python + torch"),
        PlanRow("target KV cache", kv, True, f"{t.num_layers} layers x {b.max_seq_len}+{block} tokens x {kv_heads_per_rank(t.num_kv_heads, tp)} KV heads x {t.head_dim} x {q.kv_cache}"),
        PlanRow("drafter context cache", ctx, True, f"{d.num_layers} layers x {b.max_seq_len}+{block} tokens x {kv_heads_per_rank(d.num_kv_heads, tp)} KV heads x {d.head_dim} x {ctx_fmt}"),
        PlanRow("verify logits", logits, True, f"{block} x vocab {t.vocab_size} / tp x fp32"),
    ]
    if dummy_slot:
        rows.insert(4, PlanRow("drafter dummy slot", dummy_slot, False, "TensorRT-LLM DFlash arena has max_batch_size+1 slots"))
    fixed = sum(r.bytes for r in rows if not r.per_sequence)
    per_seq = sum(r.bytes for r in rows if r.per_sequence)
    capacity = gpu.memory_bytes * CAPACITY_FRACTION
    total = fixed + b.max_batch_size * per_seq
    max_conc = max(0, math.floor((capacity - fixed) / per_seq))

    # Batch-1 decode reads every active weight once per step (plus the LM head).
    active_linear = t.active_params - t.embedding_params
    head = t.vocab_size * t.hidden_size * HIGH_PRECISION
    read = (active_linear * wbytes + head) / tp
    floor_ms = read / (gpu.hbm_bandwidth_tbs * 1e12) * 1e3 if gpu.hbm_bandwidth_tbs else None

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
        max_concurrency=max_conc,
        fits=total <= capacity,
        weights_read_per_step_bytes=read,
        bandwidth_floor_ms=floor_ms,
    )
