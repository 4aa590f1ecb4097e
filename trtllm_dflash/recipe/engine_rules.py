"""The engine backend's recipe rules: what TensorRT-LLM 1.2.1 makes of the target engine
(recipe/plan/engine_layout.py): KV-cache block reuse, the Executor steps a verify round takes, the
step budget against TensorRT's tensor volume and the Executor's input limit, greedy verify."""

from __future__ import annotations

from trtllm_dflash.recipe.issues import Issue
from trtllm_dflash.recipe.plan.engine_layout import (
    TENSOR_VOLUME,
    TENSOR_VOLUME_ISSUE,
    kv_reuse_decision,
    max_draft_len,
    max_step_tokens,
    runtime_max_input_len,
    target_attention,
    target_seq_len,
    verify_cost,
    widest_per_token,
)
from trtllm_dflash.recipe.plan.planner import plan
from trtllm_dflash.recipe.schema import Recipe
from trtllm_dflash.recipe.support import backend as backend_spec


def engine_issues(recipe: Recipe) -> list[Issue]:
    """What TensorRT-LLM 1.2.x makes of the target engine (recipe/plan/engine_layout.py): KV-cache block
    reuse needs paged context FMHA, and every verify round's whole-sequence prompt must fit the
    Executor's input limit."""
    b = recipe.build
    if not backend_spec(recipe.backend.name).builds_engines:
        if b.kv_cache_reuse is not None:
            return [Issue("error", "build.kv_cache_reuse",
                          f"applies to the engine backend only, not {recipe.backend.name} "
                          "(the pytorch backend's reuse is deploy's per-version choice); remove it")]
        return []
    q, flags, issues = recipe.quantization, target_attention(recipe), []
    on, why = kv_reuse_decision(recipe)
    cost = verify_cost(recipe)
    if not flags.paged_context_fmha and b.kv_cache_reuse:
        dtype = q.checkpoint_dtype("target")
        layout = (f"quantization.target_weights {q.target_weights}"
                  + (f" (checkpoint dtype {dtype})" if dtype != q.target_weights else "")
                  + f" with quantization.kv_cache {q.kv_cache}")
        issues.append(Issue("error", "build.kv_cache_reuse", f"true, but {layout} builds a target engine without paged "
                            f"context FMHA ({why}), and the 1.2.1 Executor then switches block reuse off; set "
                            "build.kv_cache_reuse to false or change those fields"))
    elif cost.recomputes:
        issues.append(Issue("warning", "build.kv_cache_reuse", cost.describe()))
    elif q.kv_cache == "fp8":
        issues.append(Issue("warning", "build.kv_cache_reuse", f"on: {why}"))
    issues += _verify_step_issues(recipe, cost)
    width, what = widest_per_token(recipe)
    if b.max_num_tokens * width > TENSOR_VOLUME:
        issues.append(Issue("error", "build.max_num_tokens", f"{b.max_num_tokens} tokens x {width} elements of {what} "
                            f"pass TensorRT's tensor volume of 2^31 - 1 in one step (prefills pack that many tokens): "
                            f"every request in flight would fail ({TENSOR_VOLUME_ISSUE}); at most "
                            f"{max_step_tokens(recipe)}"))
    if not recipe.gpu.is_cpu:
        logits = b.max_num_tokens * (max_draft_len(recipe) + 1) * recipe.target_facts.vocab_size * 4 / 2**30
        issues.append(Issue("warning", "backend", f"the engines verify greedily on GPU: requests with temperature > 0 "
                            "are refused (a sampling verify reads dflash_logits, which TensorRT-LLM 1.2.x's Executor "
                            f"would pre-allocate for build.max_num_tokens rows: {logits:.1f} GiB per rank; "
                            "recipe/plan/engine_memory.py); sample on the pytorch or reference backend"))
    seq = target_seq_len(recipe)
    cap = runtime_max_input_len(max_seq_len=seq, max_input_len=seq - 1, max_num_tokens=b.max_num_tokens,
                                context_fmha=flags.context_fmha)
    if cap < seq - 1:
        issues.append(Issue("error", "build.max_num_tokens", f"{b.max_num_tokens} < {seq - 1} = build.max_seq_len + "
                            f"max_draft_len {max_draft_len(recipe)} - 1: a verify round sends the whole sequence as "
                            "one prompt, and TensorRT-LLM 1.2.1 with context FMHA refuses prompts longer than "
                            "min(max_seq_len - 1, max_num_tokens) (trtGptModel.h)"))
    return issues


def fewest_steps(recipe: Recipe, cost) -> tuple[int, int] | None:
    """(build.max_num_tokens, Executor steps) of the smallest step budget that verifies the planned
    concurrency in the fewest steps the memory plan still fits (STEP_RULE), None when not even the
    recipe's own fits or nothing better does."""
    c, length = cost.planned, cost.context + cost.block
    for k in range(1, len(cost.steps(c))):
        tokens = -(-(-(-c // k) * length) // 256) * 256  # ceil(c / k) sequences of `length`, in 256s
        if tokens <= recipe.build.max_num_tokens:
            break
        if tokens > max_step_tokens(recipe):
            continue
        trial = recipe.model_copy(update={"build": recipe.build.model_copy(update={"max_num_tokens": tokens})})
        if plan(trial).fits:
            return tokens, len(cost.steps(c)) if tokens == recipe.build.max_num_tokens else k
    return None


def _verify_step_issues(recipe: Recipe, cost) -> list[Issue]:
    """A verify round of the planned concurrency that takes more than one Executor step (STEP_RULE):
    what it costs, and the max_num_tokens that takes the fewest steps the memory plan fits."""
    steps = cost.steps(cost.planned)
    if len(steps) == 1 or recipe.gpu.is_cpu:
        return []
    msg = cost.describe().split("; ", 1)[-1]
    better = fewest_steps(recipe, cost)
    if better:
        msg += f"; build.max_num_tokens {better[0]} fits the memory plan and takes {better[1]}"
    return [Issue("warning", "build.max_num_tokens", msg + " (each step reads the target's weights again: `project` "
                  "prices it)")]
