"""What the engine backend's two engines allocate beyond weights and caches, per rank, from the
engines' own tensors at the largest shapes their optimization profiles take (the tensors and
dims engines/plan.py writes to plan.json; tests/engines/test_plan_memory.py derives these rows from
plan.json, so a changed shape or dim range that is not followed here fails that test).

With B = build.max_batch_size, N = build.max_num_tokens, C = build.max_input_len (the drafter's
new_ctx), T = max_draft_len + 1 (the block), V = the target's vocabulary, H = hidden size, act =
bytes of the checkpoint dtype, tp / dtp = the ranks the target / drafter is split over:

target output buffers (start-up)
    The 1.2.1 Executor's RuntimeBuffers (cpp/tensorrt_llm/batch_manager/runtimeBuffers.cpp,
    created by TrtGptModelInflightBatching::createBuffers before the KV cache manager sizes its
    pool) hold the stock `logits` at [B, V] fp32 (numLogits = B, gathered: full vocab on every
    rank) and each output registered in ExecutorConfig.additional_model_outputs
    (EXECUTOR_OUTPUTS) at the engine's shape with its first dim set to the step's token count,
    pre-allocated at N (RuntimeBuffers::reshape after setMaxBufferSizes): dflash_ctx [N, H],
    dflash_tail [N, T, H], dflash_argmax [N, T]. A per-sequence output costs N x its row, not
    B x its row: dflash_logits would take N x T x V x 4 bytes (75 GiB per rank for Qwen3-8B at
    N = 8192, T = 16), so it is not registered and the engine backend verifies greedily on GPU.
verify logits (start-up)
    The target engine's activations for its tail logits (engines/trtllm_models.py _mark_dflash: the
    stock lm_head, a ColumnLinear with gather_output=True): the bf16 logits of B x T rows over the
    full vocabulary, before the cast to the fp32 output and the argmax; at tp > 1 also the rank's
    V / tp slice and the all-gather's full-vocab buffer before the concat.
verify logits output (per sequence, after pool)
    dflash_logits [B, T, V] fp32 is still an engine output; unregistered, TllmRuntime gives it a
    buffer of the step's shape when the step runs (runtime/tllmRuntime.cpp setOutputTensors), from
    what the pool left: T x V x 4 per sequence.
drafter engine activations (start-up)
    TensorRT sizes an execution context's activation memory for the largest shapes of its
    optimization profile (formats/engine_io.py drafter_dim_ranges: batch B, new_ctx C, block T) and
    allocates it at create_execution_context, which runtime/trt_runners.py does before the Executor
    carves its pool. TensorRT reuses activation memory between layers, so the estimate is one
    layer's live tensors, per phase, summed (the builder's tactics add workspaces no formula sees):
      context rows: B x C x 4 x kv_width/dtp x act     (the K/V projection, K's norm and its RoPE)
      block:        B x T x (2 H + q_width/dtp + 2 kv_width/dtp + 3 ffn/dtp) x act
      logits:       B x (T-1) x V/dtp x act, + B x (T-1) x V x act at dtp > 1 (the all-gather)
drafter engine I/O (per sequence, after pool)
    The buffers the drafter runner binds each step (runtime/drafter_runner.py; the arena is the
    "drafter context cache" row): block_ids, block_positions [T], ctx_rows [C, H] act,
    ctx_positions [C], new_ctx_lens, cache_lens, draft_ids [T-1], draft_logits [T-1, V] act.
verify recompute
    Where the target Executor cannot reuse KV blocks (recipe/plan/engine_layout.py kv_block_reuse),
    every verify round is a context request of the whole sequence. Memory does not grow with it:
    the engine's activations are sized for N tokens per step already (the "activations" row),
    and verify asks for no per-token output; the cost is time (`project`). The row says so at
    0 bytes; a verify design that asks per-token outputs on recompute adds them here.

The drafter arena ("drafter context cache") holds the engine's max_seq_len rows per sequence:
build.max_seq_len + max_draft_len (recipe/plan/engine_layout.py target_seq_len).
"""

from __future__ import annotations

import math

from trtllm_dflash.recipe.hardware import BYTES_PER_ELEMENT
from trtllm_dflash.recipe.plan.engine_layout import kv_block_reuse, max_draft_len
from trtllm_dflash.recipe.plan.sharding import kv_heads_per_rank
from trtllm_dflash.recipe.schema import Recipe

# The target engine's outputs the engine backend registers with the 1.2.1 Executor
# (runtime/trt_runners.py executor_config); not dflash_logits (see "target output buffers" above).
EXECUTOR_OUTPUTS = ("dflash_ctx", "dflash_tail", "dflash_argmax")
FP32, INT32 = 4.0, 4.0


def _act(recipe: Recipe, role: str) -> float:
    return BYTES_PER_ELEMENT[recipe.quantization.checkpoint_dtype(role)]


def executor_output_rows(recipe: Recipe) -> dict[str, float]:
    """Bytes of one row (every dim after the first) of each target output the Executor registers."""
    t, block, act = recipe.target_facts, max_draft_len(recipe) + 1, _act(recipe, "target")
    rows = {"dflash_ctx": t.hidden_size * act, "dflash_tail": block * t.hidden_size * act,
            "dflash_logits": block * t.vocab_size * FP32, "dflash_argmax": block * INT32}  # [T, V] fp32, [T] int32
    return {name: rows[name] for name in EXECUTOR_OUTPUTS}


def target_output_buffers(recipe: Recipe) -> float:
    """The Executor's buffers for the target's outputs: stock logits [B, V] fp32 + N x each row."""
    b, t = recipe.build, recipe.target_facts
    return b.max_batch_size * t.vocab_size * FP32 + b.max_num_tokens * sum(executor_output_rows(recipe).values())


def verify_logit_activations(recipe: Recipe, tp: int) -> float:
    """The target engine's bf16 tail logits before the fp32 cast (+ the tp slice and all-gather)."""
    t, rows = recipe.target_facts, recipe.build.max_batch_size * (max_draft_len(recipe) + 1)
    copies = 1 + ((1 / tp + 1) if tp > 1 else 0)
    return rows * t.vocab_size * _act(recipe, "target") * copies


def verify_logits_output_per_seq(recipe: Recipe) -> float:
    """dflash_logits' fp32 rows of one sequence when the Executor does not register it (else 0)."""
    if "dflash_logits" in EXECUTOR_OUTPUTS:
        return 0.0
    return (max_draft_len(recipe) + 1) * recipe.target_facts.vocab_size * FP32


def drafter_activations(recipe: Recipe, dtp: int) -> float:
    """One drafter layer's live tensors at the profile's largest shapes, per phase, summed."""
    d, v, b = recipe.drafter_facts, recipe.target_facts.vocab_size, recipe.build
    B, C, T, act = b.max_batch_size, b.max_input_len, max_draft_len(recipe) + 1, _act(recipe, "drafter")
    kv = kv_heads_per_rank(d.num_kv_heads, dtp) * d.head_dim
    q, ffn = math.ceil(d.num_attention_heads / dtp) * d.head_dim, d.intermediate_size / dtp
    ctx = B * C * 4 * kv
    block = B * T * (2 * d.hidden_size + q + 2 * kv + 3 * ffn)
    logits = B * (T - 1) * v * (1 / dtp + (1 if dtp > 1 else 0))
    return (ctx + block + logits) * act


def drafter_io_per_seq(recipe: Recipe) -> float:
    """The drafter engine's inputs and outputs (not the arena) of one sequence at their largest."""
    d, C, T = recipe.drafter_facts, recipe.build.max_input_len, max_draft_len(recipe) + 1
    act, v = _act(recipe, "drafter"), recipe.target_facts.vocab_size
    ints = 2 * T + C + 2 + (T - 1)  # block_ids, block_positions, ctx_positions, the two lens, draft_ids
    return ints * INT32 + C * d.hidden_size * act + (T - 1) * v * act


def recomputes(recipe: Recipe) -> bool:
    """Whether every verify round re-prefills its whole sequence (no KV block reuse)."""
    return not kv_block_reuse(recipe)
