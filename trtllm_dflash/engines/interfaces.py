"""Each engine's interface as plan.json lists it: the target's stock inputs (fed by the Executor)
and DFlash tap outputs, the drafter's block, context rows and arena I/O, with the symbolic dims
their shapes use. engines/trtllm_models.py declares the same tensors; formats/engine_io.py holds
the names and shapes the runners share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trtllm_dflash.engines.build_config import TOKENS_PER_BLOCK, kv_dtype
from trtllm_dflash.formats import engine_io
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.plan.drafter import drafter_placement
from trtllm_dflash.recipe.plan.engine_layout import DTYPE_NAMES


@dataclass(frozen=True)
class Tensor:
    """One engine input or output. Shapes use the symbolic dims of EnginePlan.dims; a name with
    `{l}` stands for one tensor per drafter layer (l = 0 .. num_layers-1)."""

    name: str
    dtype: str
    shape: tuple[str | int, ...]
    note: str = ""


def target_io(recipe: Recipe, cfg: dict, block: int) -> tuple[dict, list[Tensor], list[Tensor]]:
    """Inputs: the stock ones of GenerationMixin.prepare_basic_inputs (tensorrt_llm/models/
    generation_mixin.py) for gpt_attention_plugin + packed input + paged KV, fed by the Executor;
    outputs: logits plus the DFlash tap (docs/design/engine-path.md)."""
    t = recipe.target_facts
    act = DTYPE_NAMES[recipe.quantization.checkpoint_dtype("target")]
    layers = math.ceil(t.num_layers / recipe.parallel.pp)
    dims = {
        "num_tokens": cfg["max_num_tokens"], "num_seq": cfg["max_batch_size"], "max_seq_len": cfg["max_seq_len"],
        "max_blocks_per_seq": math.ceil(cfg["max_seq_len"] / TOKENS_PER_BLOCK), "num_layers": layers,
        "hidden": t.hidden_size, "vocab": t.vocab_size, "block": block,
    }
    stock = "stock (prepare_basic_inputs)"
    inputs = [
        Tensor("input_ids", "int32", ("num_tokens",),
               "packed tokens: context chunks, prompts + drafts of verify rounds"),
        Tensor("position_ids", "int32", ("num_tokens",), stock),
        Tensor("last_token_ids", "int32", ("num_seq",),
               "inclusive end offset of each sequence; the tail gather reads it"),
        Tensor("sequence_length", "int32", ("num_seq",), stock),
        Tensor("context_lengths", "int32", ("num_seq",), stock),
        Tensor("host_context_lengths", "int32", ("num_seq",), stock),
        Tensor("host_request_types", "int32", ("num_seq",), stock),
        Tensor("host_past_key_value_lengths", "int32", ("num_seq",), stock),
        Tensor("host_max_attention_window_sizes", "int32", ("num_layers",), stock),
        Tensor("host_sink_token_length", "int32", (1,), stock),
        Tensor("cache_indirection", "int32", ("num_seq", 1, "max_seq_len"), stock),
        Tensor("kv_cache_block_offsets", "int32", (1, "num_seq", 2, "max_blocks_per_seq"), stock),
        Tensor("host_kv_cache_block_offsets", "int32", (1, "num_seq", 2, "max_blocks_per_seq"), stock),
        Tensor("host_kv_cache_pool_pointers", "int64", (1, 2), stock),
        Tensor("host_kv_cache_pool_mapping", "int32", ("num_layers", 2), stock),
        Tensor("host_runtime_perf_knobs", "int64", (16,), stock),
        Tensor("host_context_progress", "int64", (1,), stock),
    ]
    if recipe.parallel.tp > 1:
        inputs.append(Tensor("all_reduce_workspace", "int64", ("all_reduce_size",), stock + ", tp > 1"))
    outputs = [
        Tensor("logits", "float32", ("num_seq", "vocab"),
               "last token of each sequence (stock; the AR baseline uses it)"),
        Tensor("dflash_ctx", act, ("num_tokens", "hidden"),
               "hidden_norm(fc(concat of target_layer_ids taps)); gatherContext=true, requested on the prefill round"),
        Tensor("dflash_tail", act, ("num_seq", "block", "hidden"),
               "dflash_ctx rows of each sequence's last `block` tokens (clamped at its start); gatherContext=false"),
        Tensor("dflash_logits", "float32", ("num_seq", "block", "vocab"),
               "logits of those rows (lm_head); gatherContext=false, requested by sampling decoders"),
        Tensor("dflash_argmax", "int32", ("num_seq", "block"),
               "greedy token after each of those rows (lm_head + top-1)"),
    ]
    return dims, inputs, outputs


def drafter_io(recipe: Recipe, cfg: dict, block: int) -> tuple[dict, list[Tensor], list[Tensor]]:
    """The drafter engine's own interface (docs/design/engine-path.md, "Drafter engine"; in the
    shapes of runtime/networks.py `drafter_forward` and the plugin's contract: plugins/kv_inject_attention/
    README.md). engines/trtllm_models.py declares these in `prepare_inputs`; the TensorRT drafter
    runner feeds them."""
    d = recipe.drafter_facts
    tp = drafter_placement(recipe).tp
    act = DTYPE_NAMES[recipe.quantization.checkpoint_dtype("drafter")]
    kv = kv_dtype(recipe, "drafter")
    ranges = engine_io.drafter_dim_ranges(cfg["max_batch_size"], cfg["max_input_len"], cfg["max_seq_len"], block)
    dims = {
        **{name: hi for name, (_, _, hi) in ranges.items() if name != "block"},
        "hidden": d.hidden_size, "kv_heads": max(1, d.num_kv_heads // tp), "head_dim": d.head_dim,
        "num_layers": d.num_layers, "block": block, "drafts": block - 1, "vocab": recipe.target_facts.vocab_size,
    }
    arena = "context arena of drafter layer {l}: rows < cache_lens valid; this step's rows are appended in place"
    present = ("the arena after this step's append (trtllm_dflash::kv_append): the runner binds it to the "
               "{kv}_cache_{l} buffer, so only the new rows are written")
    inputs = [
        Tensor("block_ids", "int32", ("batch", "block"), "[anchor = last accepted token, mask_token_id x drafts]"),
        Tensor("block_positions", "int32", ("batch", "block"), "cache_lens + new_ctx_lens + 0..block-1"),
        Tensor("ctx_rows", act, ("batch", "new_ctx", "hidden"), "new fused context rows (dflash_ctx / dflash_tail)"),
        Tensor("ctx_positions", "int32", ("batch", "new_ctx"), "absolute position of each new row (its RoPE)"),
        Tensor("new_ctx_lens", "int32", ("batch",), "valid new rows per sequence (the rest is padding)"),
        Tensor("cache_lens", "int32", ("batch",), "rows already in the arena before this step"),
        Tensor("k_cache_{l}", kv, ("batch", "max_seq_len", "kv_heads", "head_dim"), arena),
        Tensor("v_cache_{l}", kv, ("batch", "max_seq_len", "kv_heads", "head_dim"), arena),
    ]
    if tp > 1:
        inputs.append(Tensor("all_reduce_workspace", "int64", ("all_reduce_size",),
                             "tp > 1 (prepare_basic_inputs' form)"))
    outputs = [
        Tensor("draft_ids", "int32", ("batch", "drafts"), "the target's lm_head + top-1 on the mask slots"),
        Tensor("draft_logits", act, ("batch", "drafts", "vocab"), "their logits (the DrafterRunner result)"),
        Tensor("present_k_cache_{l}", kv, ("batch", "max_seq_len", "kv_heads", "head_dim"),
               present.format(kv="k", l="{l}")),
        Tensor("present_v_cache_{l}", kv, ("batch", "max_seq_len", "kv_heads", "head_dim"),
               present.format(kv="v", l="{l}")),
    ]
    return dims, inputs, outputs
