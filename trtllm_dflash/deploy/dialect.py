"""The TensorRT-LLM-on-Triton dialect: three thin models beside `dflash`, with the request and
response tensors of tensorrtllm_backend's inflight_batcher_llm model repository.

What they mirror (TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm/`, the 1.2.x
templates; tensorrtllm_backend r26.04-r26.07 pin TensorRT-LLM release/1.2.1 as submodule
2fdb9e66 / ca88df0a, whose copies are not in our source index, so the stored versions read were):
- `ensemble/config.pbtxt` (commit 2a9abd95): text in, `text_output` out, batch dimension first;
- `tensorrt_llm_bls/config.pbtxt` (commit 0193dbd4): the ensemble's inputs plus the multimodal
  inputs and the draft-target inputs `num_draft_tokens`, `use_draft_logits`;
- `tensorrt_llm/config.pbtxt` (commit 0c8de69a): token ids in (`input_ids`, `input_lengths`,
  `request_output_len`, `end_id`, `pad_id`, `streaming`, ...), `output_ids` / `sequence_length` out.
Names, data types and dims (without the batch dimension) are upstream's; `${logits_datatype}`
is FP32 and `${prompt_embedding_table_data_type}` FP16. Every upstream input is declared, so a
request using one we cannot honour (LoRA, prompt tables, images, beams) passes Triton's checks
and gets our per-request error naming it (serve/dialect.py), instead of Triton's "unexpected
input". Our own per-request inputs (`mode`, `draft_len`) and speculative statistics (`rounds`,
`acceptance_length`, ...) are extra optional tensors.

All three are Python models, forwarding every request to `dflash` over decoupled BLS
(serve/dialect_model.py): one decoder, one scheduler, one KV pool, no second copy of the weights.
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

from trtllm_dflash.deploy.settings import DFLASH_OUTPUTS, Tensor
from trtllm_dflash.deploy.triton_config import _model_config
from trtllm_dflash.recipe import Recipe

S, B, I32, U64, F32, F16, U8 = (mc.TYPE_STRING, mc.TYPE_BOOL, mc.TYPE_INT32, mc.TYPE_UINT64, mc.TYPE_FP32,
                                mc.TYPE_FP16, mc.TYPE_UINT8)

# The sampling, penalty and return_* inputs every upstream model has, with the ensemble's names.
_COMMON = (
    Tensor("end_id", I32, optional=True),
    Tensor("pad_id", I32, optional=True),
    Tensor("top_k", I32, optional=True),
    Tensor("top_p", F32, optional=True),
    Tensor("temperature", F32, optional=True),
    Tensor("length_penalty", F32, optional=True),
    Tensor("repetition_penalty", F32, optional=True),
    Tensor("min_tokens", I32, optional=True),
    Tensor("presence_penalty", F32, optional=True),
    Tensor("frequency_penalty", F32, optional=True),
    Tensor("seed", U64, optional=True),
    Tensor("return_log_probs", B, optional=True),
    Tensor("return_context_logits", B, optional=True),
    Tensor("return_generation_logits", B, optional=True),
    Tensor("return_perf_metrics", B, optional=True),
    Tensor("return_num_input_tokens", B, optional=True),
    Tensor("return_num_output_tokens", B, optional=True),
    Tensor("num_return_sequences", I32, optional=True),
    Tensor("beam_width", I32, optional=True),
    Tensor("exclude_input_in_output", B, optional=True),
    Tensor("prompt_embedding_table", F16, (-1, -1), optional=True),
    Tensor("prompt_vocab_size", I32, optional=True),
    Tensor("lora_task_id", U64, optional=True),
    Tensor("lora_weights", F16, (-1, -1), optional=True),
    Tensor("lora_config", I32, (-1, 3), optional=True),
    Tensor("guided_decoding_guide_type", S, optional=True),
    Tensor("guided_decoding_guide", S, optional=True),
)
# Ours, beside the template's: the dflash model's per-request decoding, and `random_seed`, the
# name of the seed input before TensorRT-LLM 0.10 that older load generators still send.
_EXTRA_INPUTS = (
    Tensor("draft_len", I32, optional=True),
    Tensor("mode", S, optional=True),
    Tensor("random_seed", U64, optional=True),
)

ENSEMBLE_INPUTS = (
    Tensor("text_input", S),
    Tensor("decoder_text_input", S, optional=True),
    Tensor("max_tokens", I32),
    Tensor("bad_words", S, (-1,), optional=True),
    Tensor("stop_words", S, (-1,), optional=True),
    Tensor("stream", B, optional=True),
    Tensor("prompt_table_extra_id", U64, optional=True),
    Tensor("embedding_bias_words", S, (-1,), optional=True),
    Tensor("embedding_bias_weights", F32, (-1,), optional=True),
    *_COMMON,
    *_EXTRA_INPUTS,
)
BLS_INPUTS = ENSEMBLE_INPUTS + (
    Tensor("image_input", F16, (-1, 3, -1, -1), optional=True),
    Tensor("image_bytes_input", U8, (-1, -1, -1, -1), optional=True),
    Tensor("image_url_input", S, optional=True),
    Tensor("video_bytes_input", U8, (-1, -1, -1, -1), optional=True),
    Tensor("num_draft_tokens", I32, optional=True),
    Tensor("use_draft_logits", B, optional=True),
)
# The tensorrt_llm model names some sampling inputs differently (runtime_top_k, len_penalty, streaming).
_TRTLLM_RENAMED = {"top_k": "runtime_top_k", "top_p": "runtime_top_p", "length_penalty": "len_penalty"}
TRTLLM_INPUTS = (
    Tensor("input_ids", I32, (-1,)),
    Tensor("input_lengths", I32),
    Tensor("request_output_len", I32),
    Tensor("streaming", B, optional=True),
    Tensor("stop", B, optional=True),
    Tensor("stop_words_list", I32, (2, -1), optional=True),
    Tensor("bad_words_list", I32, (2, -1), optional=True),
    Tensor("embedding_bias", F32, (-1,), optional=True),
    Tensor("draft_input_ids", I32, (-1,), optional=True),
    Tensor("draft_logits", F32, (-1, -1), optional=True),
    Tensor("draft_acceptance_threshold", F32, optional=True),
    Tensor("decoder_input_ids", I32, (-1,), optional=True),
    Tensor("decoder_input_lengths", I32, optional=True),
    Tensor("encoder_input_features", F16, (-1, -1), optional=True),
    Tensor("runtime_top_p_min", F32, optional=True),
    Tensor("runtime_top_p_decay", F32, optional=True),
    Tensor("runtime_top_p_reset_ids", I32, optional=True),
    Tensor("early_stopping", B, optional=True),
    Tensor("beam_search_diversity_rate", F32, optional=True),
    Tensor("prompt_table_extra_ids", U64, (-1,), optional=True),
    Tensor("encoder_output_lengths", I32, optional=True),
    Tensor("cross_attention_mask", B, (-1, -1), optional=True),
    Tensor("mrope_rotary_cos_sin", F32, (-1,), optional=True),
    Tensor("mrope_position_deltas", mc.TYPE_INT64, optional=True),
    Tensor("context_phase_params", U8, (-1,), optional=True),
    Tensor("skip_cross_attn_blocks", B, optional=True),
    *(Tensor(f"retention_token_range_{n}", I32, (-1,), optional=True) for n in ("starts", "ends", "priorities",
                                                                               "durations_ms")),
    Tensor("retention_decode_priority", I32, optional=True),
    Tensor("retention_decode_duration_ms", I32, optional=True),
    *(Tensor(f"lookahead_{n}", I32, optional=True) for n in ("window_size", "ngram_size", "verification_set_size")),
    *(Tensor(_TRTLLM_RENAMED.get(t.name, t.name), t.dtype, t.dims, t.optional) for t in _COMMON),
    *_EXTRA_INPUTS,
)

# Upstream's outputs, declared so that a client may name any of them. Sent: the speculative counts,
# acceptance_rate, num_*_tokens and the request's timestamps as this model sees them
# (return_perf_metrics), the log-probs (return_log_probs) and batch_index (a request of several
# prompts); never sent: logits (refused when asked), sequence_index (one sequence), KV-cache
# block counts and first_scheduled_time_ns (the dflash engine does not report them).
_TEMPLATE_OUTPUTS = (
    Tensor("cum_log_probs", F32, (-1,)),
    Tensor("output_log_probs", F32, (-1, -1)),
    Tensor("context_logits", F32, (-1, -1)),
    Tensor("generation_logits", F32, (-1, -1, -1)),
    Tensor("batch_index", I32),
    Tensor("sequence_index", I32),
    Tensor("kv_cache_alloc_new_blocks", I32),
    Tensor("kv_cache_reused_blocks", I32),
    Tensor("kv_cache_alloc_total_blocks", I32),
    Tensor("arrival_time_ns", mc.TYPE_INT64),
    Tensor("first_scheduled_time_ns", mc.TYPE_INT64),
    Tensor("first_token_time_ns", mc.TYPE_INT64),
    Tensor("last_token_time_ns", mc.TYPE_INT64),
    Tensor("acceptance_rate", F32),
    Tensor("total_accepted_draft_tokens", I32),
    Tensor("total_draft_tokens", I32),
    Tensor("num_input_tokens", I32),
    Tensor("num_output_tokens", I32),
)
# The speculative statistics and progress of the dflash model (rounds, acceptance_length, our
# acceptance_histogram, ...), batch-first here; those upstream declares are its template's above.
_STATS = tuple(t for t in DFLASH_OUTPUTS if t.name not in ("text_output", "output_ids")
               and t.name not in {u.name for u in _TEMPLATE_OUTPUTS})
TEXT_OUTPUTS = (Tensor("text_output", S, (-1,)),) + _TEMPLATE_OUTPUTS + _STATS
TRTLLM_OUTPUTS = (Tensor("output_ids", I32, (-1, -1)), Tensor("sequence_length", I32, (-1,)),
                  Tensor("context_phase_params", U8, (-1,))) + _TEMPLATE_OUTPUTS + _STATS

# model name -> (kind, inputs, outputs); the kind is what serve/dialect.py maps.
DIALECT_MODELS = {
    "ensemble": ("text", ENSEMBLE_INPUTS, TEXT_OUTPUTS),
    "tensorrt_llm_bls": ("text", BLS_INPUTS, TEXT_OUTPUTS),
    "tensorrt_llm": ("ids", TRTLLM_INPUTS, TRTLLM_OUTPUTS),
}


def dialect_model_config(recipe: Recipe, name: str) -> mc.ModelConfig:
    """config.pbtxt of one dialect model: decoupled like `dflash` (streaming needs it), forwarding
    to the deployment's dflash model (parameter `dflash_model`). Batch-first (max_batch_size > 0,
    as upstream's templates), so requests are [1, 1]; without dynamic_batching Triton hands the
    model each request as sent, and the dflash engine batches in flight behind it."""
    kind, inputs, outputs = DIALECT_MODELS[name]
    return _model_config(
        name, inputs, outputs, instances=1, decoupled=recipe.serve.decoupled,
        parameters={"dflash_model": recipe.serve.model_name, "dialect": kind},
        max_batch_size=recipe.build.max_batch_size,
    )
