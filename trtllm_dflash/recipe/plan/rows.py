"""What one rank holds for a recipe: the memory plan's rows, each with its formula and where it is
allocated (recipe/plan/fit.py adds them up against a GPU).

Per rank (how tp splits each dimension, and the vocabulary rows a rank holds: recipe/plan/sharding.py):

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
                      recipe/plan/engine_memory.py, checked against plan.json's tensors)
    target KV / seq = sum over layers of tokens(layer) * 2 * kv_heads_per_rank * head_dim * bytes(kv_cache)
                      tokens = max_seq_len + block_size (the verify block is written before the trim),
                      capped at sliding_window + block_size on sliding-window layers
    draft ctx / seq = drafter layers * (max_seq_len + block_size) * 2 * kv_heads_per_rank(dtp) * head_dim
                      * bytes(context cache); the pytorch backend keeps it in BF16 and allocates one
                      extra (dummy) slot; the drafter engine's arena holds max_seq_len + max_draft_len
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trtllm_dflash.recipe.hardware import BYTES_PER_ELEMENT, GiB, GpuSpec
from trtllm_dflash.recipe.models import ArchFacts
from trtllm_dflash.recipe.plan import engine_memory as em
from trtllm_dflash.recipe.plan.engine_layout import max_draft_len, target_seq_len
from trtllm_dflash.recipe.plan.sharding import OUR_CONVERTER, kv_heads_per_rank, vocab_rows_per_rank
from trtllm_dflash.recipe.schema import Recipe
from trtllm_dflash.recipe.support import backend as backend_spec

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


def target_kv_bytes_per_seq(t: ArchFacts, tp: int, max_seq_len: int, block_size: int, kv_bytes: float) -> float:
    tokens_full = max_seq_len + block_size
    tokens_sliding = min(tokens_full, (t.sliding_window or tokens_full) + block_size)
    n_full = t.num_layers - t.sliding_layers
    per_token_per_layer = 2 * kv_heads_per_rank(t.num_kv_heads, tp) * t.head_dim * kv_bytes
    return (n_full * tokens_full + t.sliding_layers * tokens_sliding) * per_token_per_layer


def drafter_ctx_bytes_per_seq(d: ArchFacts, tp: int, max_seq_len: int, block_size: int, ctx_bytes: float) -> float:
    kv_heads = kv_heads_per_rank(d.num_kv_heads, tp)
    return d.num_layers * (max_seq_len + block_size) * 2 * kv_heads * d.head_dim * ctx_bytes


def context_cache_format(recipe: Recipe) -> str:
    """Format of the drafter's context (injected K/V) cache."""
    kv, rule = recipe.quantization.kv_cache, backend_spec(recipe.backend.name).context_cache
    if rule == "bf16":
        return "bf16"  # TensorRT-LLM's DFlash keeps it in the drafter fc dtype (BF16)
    # the drafter engine's arena (engines/build_config.py kv_dtype): FP8 or the model dtype
    if rule == "fp8-or-checkpoint":
        return "fp8" if kv == "fp8" else recipe.quantization.checkpoint_dtype("drafter")
    return kv


def kv_fraction(backend: str) -> float | None:
    """The fraction of free memory the KV pool takes (None: a backend without TensorRT-LLM's pool)."""
    return KV_CACHE_FREE_GPU_MEM_FRACTION if backend_spec(backend).kv_pool else None


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


def rank_rows(recipe: Recipe, tp: int, gpu: GpuSpec, dtp: int) -> list[PlanRow]:
    """Every row of one rank's plan at tp `tp` with the drafter split over `dtp` ranks."""
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
    """The engine backend's engine tensors beyond weights and caches (recipe/plan/engine_memory.py)."""
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
