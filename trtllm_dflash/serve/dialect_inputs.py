"""Every input the TensorRT-LLM-on-Triton dialect models declare (deploy/dialect.py) and what serve
does with it: mapped onto the dflash model's request (serve/dialect.py to_dflash), passed as it
is, accepted without effect, or refused by name (`refusal`). docs/migrate-from-tensorrtllm-backend.md's
input table is `verdict` and `describe`'s (tests/test_docs.py); `handled` checks that every
declared input is one of these.
"""

from __future__ import annotations

import numpy as np

# name -> why we cannot honour it (any non-neutral value is refused with this reason).
UNSUPPORTED = {
    **dict.fromkeys(("lora_task_id", "lora_weights", "lora_config"), "LoRA adapters are not served (the drafter is "
                    "trained on the base target)"),
    **dict.fromkeys(("prompt_embedding_table", "prompt_vocab_size", "prompt_table_extra_id", "prompt_table_extra_ids"),
                    "prompt tables are not served"),
    **dict.fromkeys(("image_input", "image_bytes_input", "image_url_input", "video_bytes_input",
                     "encoder_input_features"), "multimodal inputs are not served (text only)"),
    **dict.fromkeys(("decoder_text_input", "decoder_input_ids", "decoder_input_lengths", "encoder_output_lengths",
                     "cross_attention_mask",
                     "skip_cross_attn_blocks"), "encoder-decoder models are not served"),
    **dict.fromkeys(("mrope_rotary_cos_sin", "mrope_position_deltas"), "multimodal inputs are not served (text only)"),
    "context_phase_params": "disaggregated serving is not supported",
    **dict.fromkeys(("retention_token_range_starts", "retention_token_range_ends", "retention_token_range_priorities",
                     "retention_token_range_durations_ms", "retention_decode_priority", "retention_decode_duration_ms"),
                    "KV-cache retention priorities are not applied"),
    **dict.fromkeys(("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size"),
                    "lookahead decoding is not served (DFlash is the speculative decoder)"),
    **dict.fromkeys(("embedding_bias", "embedding_bias_words", "embedding_bias_weights"),
                    "logit biases are not applied by the DFlash verifier"),
    **dict.fromkeys(("guided_decoding_guide_type", "guided_decoding_guide"), "guided decoding is not served"),
    **dict.fromkeys(("draft_input_ids", "draft_logits", "draft_acceptance_threshold", "num_draft_tokens",
                     "use_draft_logits"),
                    "drafts come from the DFlash drafter (use draft_len for the drafts per round)"),
    **dict.fromkeys(("runtime_top_p_min", "runtime_top_p_decay", "runtime_top_p_reset_ids",
                     "beam_search_diversity_rate", "early_stopping"), "not supported by the DFlash sampler"),
    "return_context_logits": "logits are not returned",
    "return_generation_logits": "logits are not returned",
    "stop": "stop requests are not supported: cancel the request instead",
}
# name -> (the value that changes nothing, why another one cannot be honoured)
NEUTRAL = {
    "beam_width": (1, "DFlash decodes one beam; send beam_width 1"),
    "num_return_sequences": (1, "one sequence per request"),
    "repetition_penalty": (1.0, "penalties are not applied by the DFlash verifier"),
    "presence_penalty": (0.0, "penalties are not applied by the DFlash verifier"),
    "frequency_penalty": (0.0, "penalties are not applied by the DFlash verifier"),
    "min_tokens": (1, "min_tokens is not supported (end_id may end a request after its first token)"),
}
NEUTRAL_ALSO = {"num_return_sequences": (0,), "min_tokens": (0,)}  # values meaning "unset" upstream too
# Accepted, and they change nothing here.
IGNORED = {"pad_id": "one sequence per request, never padded", "length_penalty": "scores beams only",
           "len_penalty": "scores beams only"}

# The dialect's names of the inputs it maps, per kind: (prompt, max tokens, streaming flag).
NAMES = {"text": ("text_input", "max_tokens", "stream"), "ids": ("input_ids", "request_output_len", "streaming")}
RENAMED = {"runtime_top_k": "top_k", "runtime_top_p": "top_p"}  # the tensorrt_llm model's names
PASSED = ("end_id", "draft_len", "mode")  # same name, same meaning at dflash
SAMPLING = ("temperature", "top_k", "top_p")  # read by `_sampling` (the tensorrt_llm model's names RENAMED)
MAPPED = ("seed", "random_seed", "stop_words", "exclude_input_in_output", "input_lengths", "return_perf_metrics",
          "return_num_input_tokens", "return_num_output_tokens", "return_log_probs")  # read by to_dflash itself
# Token-level stop and bad words: the dialect's name -> the dflash model's (same meaning: upstream's).
WORDS = {"text": {"stop_words": "stop_sequences", "bad_words": "bad_words"},
         "ids": {"stop_words_list": "stop_words_list", "bad_words_list": "bad_words_list"}}

# What the mapped inputs become (docs/migrate-from-tensorrtllm-backend.md's table is `describe`'s).
MAPPED_AS = {
    "text_input": "the prompt (dflash `text_input`)",
    "input_ids": "the prompt as token ids (dflash `input_ids`), cut at `input_lengths`",
    "input_lengths": "cuts `input_ids` (upstream's padded batches)",
    "max_tokens": "dflash `max_tokens`",
    "request_output_len": "dflash `max_tokens`",
    "stream": "dflash `stream`: one response per verify round, carrying only the new text / tokens",
    "streaming": "dflash `stream`: one response per verify round, carrying only the new text / tokens",
    "end_id": "ends the request at that token, included (default: the target's eos ids)",
    "temperature": "dflash `temperature`; default 1.0 when sampling (upstream's)",
    **dict.fromkeys(("top_k", "runtime_top_k"), "dflash `top_k`; top_k and top_p both 0 or unset (or top_k 1): "
                    "greedy, whatever the temperature, as upstream"),
    **dict.fromkeys(("top_p", "runtime_top_p"), "dflash `top_p`; 0 or unset: no top-p"),
    "seed": "dflash `seed`", "random_seed": "dflash `seed` (the input's name before TensorRT-LLM 0.10)",
    "stop_words": "dflash `stop_sequences`: tokenized as upstream's preprocessing does; the output ends with the "
                  "first stop word's tokens, kept",
    "stop_words_list": "dflash `stop_words_list`: the output ends with the first stop sequence, kept",
    "bad_words": "dflash `bad_words`: tokenized as upstream's preprocessing does; masked inside verification, so "
                 "the output is the target's masked decoding",
    "bad_words_list": "dflash `bad_words_list`: masked inside verification",
    "return_log_probs": "adds output_log_probs (each token's log-probability under the target) and cum_log_probs",
    "exclude_input_in_output": "unset or false: a non-streamed answer starts with the prompt (text or ids); "
                               "streamed answers never do",
    "return_perf_metrics": "adds acceptance_rate, arrival_time_ns, first_token_time_ns, last_token_time_ns and "
                           "acceptance_histogram (ours: verify passes by the drafts each accepted)",
    "return_num_output_tokens": "adds num_output_tokens",
    "return_num_input_tokens": "tensorrt_llm: adds num_input_tokens; text models: refused",
    "draft_len": "ours: drafts per verify round for this request (0: speculation off)",
    "mode": "ours: `ar`, `dflash` or `ddtree` for this request",
}


def verdict(name: str) -> str:
    """Input `name`: honoured, accepted without effect, or refused (with a value that changes something)."""
    if name in UNSUPPORTED:
        return "refused"
    if name in NEUTRAL:
        return f"refused unless {NEUTRAL[name][0]}"
    if name in IGNORED:
        return "accepted, no effect"
    return "ours" if name in ("draft_len", "mode") else "honoured"


def describe(name: str) -> str:
    """What a dialect model does with input `name`, in a phrase."""
    if name in MAPPED_AS:
        return MAPPED_AS[name]
    if name in IGNORED:
        return f"accepted, no effect ({IGNORED[name]})"
    if name in NEUTRAL:
        ok, why = NEUTRAL[name]
        return f"{ok} only; other values refused ({why})"
    if name in UNSUPPORTED:
        return f"refused when set ({UNSUPPORTED[name]})"
    raise KeyError(name)


def handled(name: str) -> bool:
    """Every input a dialect model declares is mapped, accepted as a no-op, or refused by name."""
    mapped = (name in MAPPED or name in PASSED or name in SAMPLING or name in RENAMED
              or any(name in n for n in NAMES.values()) or any(name in w for w in WORDS.values()))
    return (mapped and name in MAPPED_AS) or name in UNSUPPORTED or name in NEUTRAL or name in IGNORED


def _neutral(arr: np.ndarray) -> bool:
    return all(not bool(v) for v in np.asarray(arr).reshape(-1))


def refusal(name: str, arr: np.ndarray) -> str | None:
    """Why input `name` with this value cannot be honoured, None when it can."""
    if name in UNSUPPORTED:
        return None if _neutral(arr) else f"{name}: {UNSUPPORTED[name]}"
    if name in NEUTRAL:
        value = np.asarray(arr).reshape(-1)
        ok, why = NEUTRAL[name]
        if value.size and any(v != ok and v not in NEUTRAL_ALSO.get(name, ()) for v in value.tolist()):
            return f"{name}: {value.tolist()[0]} is not supported ({why})"
    return None
