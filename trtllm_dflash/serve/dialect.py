"""Requests and responses of the TensorRT-LLM-on-Triton dialect, mapped to and from the `dflash`
model (pure: numpy only, no Triton, no torch; the Triton side is serve/dialect_model.py).

Two kinds (deploy/dialect.py declares the tensors):
- "text": `ensemble` and `tensorrt_llm_bls` (text in, `text_output` out);
- "ids": `tensorrt_llm` (`input_ids` in, `output_ids` / `sequence_length` out).
What upstream does that we mirror (tensorrtllm_backend v0.19.0, whose client scripts
tests/upstream/ holds unmodified; its all_models/inflight_batcher_llm/ models):
- requests are batch-first; a request of B prompts is answered with responses that each carry
  one prompt's output and, when B > 1, its `batch_index` (tensorrt_llm/1/model.py
  convert_response), the final flag after the last prompt's last response;
- per response, text_output is [beams] (postprocessing/1/model.py: one string per beam),
  output_ids and output_log_probs [1, beams, tokens], everything else [1, 1];
- a streamed response carries only its new tokens / text; a non-streamed one the prompt and the
  output unless exclude_input_in_output (the client inflight_batcher_llm_client.py prepends the
  prompt itself when streaming);
- stop words end the output with their tokens kept, bad words never appear (both token-level:
  the text models' words tokenized as preprocessing/1/model.py `_to_word_list_format` does);
- the end token is not returned (NVIDIA/TensorRT-LLM#2190): dflash's skip_end_token.

Honoured: the prompt, max_tokens / request_output_len, end_id, stop and bad words,
temperature, top_k, top_p (with upstream's greedy default, `_sampling`), seed (or the older
`random_seed`), stream / streaming, exclude_input_in_output, return_log_probs and the
return_perf_metrics / return_num_output_tokens outputs; pad_id and length_penalty are accepted
and change nothing (one sequence, never padded; length_penalty only scores beams). Refused per
request, by name: whatever needs beams, several sequences, adapters, prompt tables, images,
guided decoding, logits or penalties (`refusal`). Zeros, false and empty strings count as absent
(clients send neutral defaults). `handled` checks that every declared input is one of these.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trtllm_dflash.serve.requests import RequestError

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
DFLASH_OUTPUTS = ("text_output", "output_token_count", "total_output_tokens", "rounds", "total_draft_tokens",
                  "total_accepted_draft_tokens", "acceptance_length", "finish_reason")
STATS = DFLASH_OUTPUTS[1:]  # sent as they are (batch-first)
MAPPED = ("seed", "random_seed", "stop_words", "exclude_input_in_output", "input_lengths", "return_perf_metrics",
          "return_num_input_tokens", "return_num_output_tokens", "return_log_probs")  # read by to_dflash itself
# Token-level stop and bad words: the dialect's name -> the dflash model's (same meaning: upstream's).
WORDS = {"text": {"stop_words": "stop_sequences", "bad_words": "bad_words"},
         "ids": {"stop_words_list": "stop_words_list", "bad_words_list": "bad_words_list"}}

# Every output the dialect models declare (deploy/dialect.py): when a response carries it
# (`_outputs`: "always", the kind's own "text" / "ids", the return_* flag of the request that
# adds it, or "never") and what it is. docs/migrate-from-tensorrtllm-backend.md's output table is
# this table (tests/test_docs.py).
OUTPUTS_AS = {
    "text_output": ("text", "the text of this response: streamed, the new text only; not streamed, all of it "
                            "(after the prompt unless `exclude_input_in_output`)"),
    "output_ids": ("ids", "`[1, 1, n]`: streamed, the new tokens; not streamed, prompt (unless excluded) and output"),
    "sequence_length": ("ids", "`[1, 1]`: the number of tokens in `output_ids`"),
    "total_draft_tokens": ("always", "the request's draft tokens verified so far (upstream: with return_perf_metrics)"),
    "total_accepted_draft_tokens": ("always", "the request's draft tokens accepted so far (upstream: with "
                                              "return_perf_metrics)"),
    "acceptance_rate": ("return_perf_metrics", "accepted / drafted draft tokens so far"),
    "acceptance_histogram": ("return_perf_metrics", "ours: `[1, n]` verify passes by the drafts each accepted "
                                                    "(entry j: passes that accepted exactly j)"),
    **dict.fromkeys(("arrival_time_ns", "first_token_time_ns", "last_token_time_ns"),
                    ("return_perf_metrics", "wall clock at the model")),
    "num_output_tokens": ("return_num_output_tokens", "tokens generated so far"),
    "num_input_tokens": ("return_num_input_tokens", "prompt tokens (tensorrt_llm; the text models refuse the flag)"),
    "output_token_count": ("always", "ours: tokens committed in this response"),
    "total_output_tokens": ("always", "ours: tokens generated so far"),
    "rounds": ("always", "ours: target verify passes so far"),
    "acceptance_length": ("always", "ours: tokens committed per verify pass so far (tau)"),
    "finish_reason": ("always", "ours: `length` / `stop` on the last response, empty before"),
    "output_log_probs": ("return_log_probs", "`[1, 1, n]`: each of this response's tokens' log-probability under "
                                             "the target"),
    "cum_log_probs": ("return_log_probs", "`[1, 1]`: their sum over the whole output so far"),
    **dict.fromkeys(("context_logits", "generation_logits"), ("never", "the inputs that ask for them are refused")),
    "batch_index": ("batch", "which prompt of a request of several this response answers"),
    "sequence_index": ("never", "one sequence per prompt: index 0, what clients assume when it is absent"),
    **dict.fromkeys(("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks",
                     "first_scheduled_time_ns"), ("never", "the dflash engine does not report them")),
    "context_phase_params": ("never", "no disaggregated serving"),
}
PERF = tuple(n for n, (sent, _) in OUTPUTS_AS.items() if sent == "return_perf_metrics")
LOG_PROBS = tuple(n for n, (sent, _) in OUTPUTS_AS.items() if sent == "return_log_probs")


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


def describe_output(name: str) -> str:
    """When a dialect model sends output `name`, and what it is, in a phrase."""
    sent, what = OUTPUTS_AS[name]
    when = {"always": "every response", "text": "every response", "ids": "every response",
            "batch": "every response to a request of several prompts", "never": "never sent"}.get(sent, f"with `{sent}`")
    return f"{when}: {what}"


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


@dataclass
class Forward:
    """One dialect request as a dflash request, and how to answer it."""

    kind: str  # "text" | "ids"
    inputs: dict[str, np.ndarray]  # the dflash model's inputs
    stream: bool
    outputs: list[str]  # the dialect outputs each response carries
    echo: bytes | list[int] | None = None  # the prompt, put before the output of a non-streamed response
    arrival_ns: int = 0  # wall clock (ns) when the request arrived, and when its first tokens went out
    first_ns: int = 0
    batch_index: int = 0  # which prompt of the client's request this is, of batch_size
    batch_size: int = 1
    log_probs: bool = False  # return_log_probs

    @property
    def dflash_outputs(self) -> list[str]:
        return list(DFLASH_OUTPUTS) + ["acceptance_histogram"] + (["output_ids"] if self.kind == "ids" else []) + \
            (list(LOG_PROBS) if self.log_probs else [])


def split(inputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """A batch-first request of B prompts as B requests of one (Triton has checked that every
    input has the same batch dimension)."""
    sizes = {np.asarray(a).shape[0] for a in inputs.values() if np.asarray(a).ndim}
    if len(sizes) > 1:
        raise RequestError(f"batch: inputs have different batch dimensions {sorted(sizes)}")
    n = sizes.pop() if sizes else 1
    return [{k: np.asarray(a)[b : b + 1] for k, a in inputs.items()} for b in range(n)]


def to_dflash_batch(kind: str, inputs: dict[str, np.ndarray], requested: list[str] | None = None,
                    now_ns: int = 0) -> list[Forward]:
    """One Forward per prompt of a (batched) dialect request; upstream answers a request of B prompts
    with responses that each name their prompt (`batch_index`, sent when B > 1)."""
    items = split(inputs)
    fwds = [to_dflash(kind, item, requested, now_ns) for item in items]
    for b, fwd in enumerate(fwds):
        fwd.batch_index, fwd.batch_size = b, len(fwds)
    return fwds


def _flat(inputs: dict[str, np.ndarray], name: str) -> np.ndarray:
    """A batch-first input of one request, batch dimension dropped (a batch of several prompts is refused)."""
    arr = np.asarray(inputs[name])
    if arr.ndim == 0 or arr.shape[0] != 1:
        raise RequestError(f"{name}: shape {list(arr.shape)}: send one prompt per request (batch dimension 1)")
    return arr[0]


def _scalar(inputs: dict[str, np.ndarray], name: str):
    flat = _flat(inputs, name).reshape(-1)
    if flat.size != 1:
        raise RequestError(f"{name}: expected one value, got {flat.size}")
    return flat[0]


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


def _flag(inputs: dict[str, np.ndarray], name: str, default: bool) -> bool:
    return bool(_scalar(inputs, name)) if name in inputs else default


def to_dflash(kind: str, inputs: dict[str, np.ndarray], requested: list[str] | None = None,
              now_ns: int = 0) -> Forward:
    """The dflash request for a dialect request (inputs as received, batch-first); RequestError
    names the first input that cannot be honoured."""
    for name, arr in inputs.items():
        why = refusal(name, arr)
        if why:
            raise RequestError(why)
    if kind == "text" and _flag(inputs, "return_num_input_tokens", False):
        raise RequestError("return_num_input_tokens: the text models do not count prompt tokens (tensorrt_llm does)")
    prompt_name, max_name, stream_name = NAMES[kind]
    for name in (prompt_name, max_name):
        if name not in inputs:
            raise RequestError(f"{name}: required")
    out = {"max_tokens": np.array([_scalar(inputs, max_name)], dtype=np.int32)}
    prompt = _prompt(kind, inputs)
    out["text_input" if kind == "text" else "input_ids"] = prompt
    for name in PASSED:
        if name in inputs:
            out[name] = _flat(inputs, name).reshape(-1)
    out.update(_seed(inputs))
    out.update(_sampling(inputs))
    out.update(_words(kind, inputs))
    log_probs = _flag(inputs, "return_log_probs", False)
    if log_probs:
        out["return_log_probs"] = np.array([True])
    stream = _flag(inputs, stream_name, False)
    out["stream"] = np.array([stream])
    if kind == "text":  # upstream's postprocessing decodes with skip_special_tokens, True unless configured
        out["skip_special_tokens"] = np.array([True])
    # The executor stops at the end token without returning it (NVIDIA/TensorRT-LLM#2190).
    out["skip_end_token"] = np.array([True])
    echo = None
    if not stream and not _flag(inputs, "exclude_input_in_output", False):
        echo = bytes(prompt[0]) if kind == "text" else prompt.tolist()
    return Forward(kind, out, stream, _outputs(kind, inputs, requested), echo, arrival_ns=now_ns, log_probs=log_probs)


def _words(kind: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Stop and bad words under the dflash model's names: text words (empty ones dropped, as
    upstream's preprocessing drops words of no tokens) or a [2, N] token-id word list."""
    out = {}
    for name, to in WORDS[kind].items():
        if name not in inputs:
            continue
        if kind == "text":
            words = [w for w in _flat(inputs, name).reshape(-1) if bytes(w)]
            if words:
                out[to] = np.array(words, dtype=object)
        else:
            arr = _flat(inputs, name)
            if arr.size and (arr[1] >= 0).any():  # an all -1 offsets row: no words
                out[to] = arr.astype(np.int32)
    return out


def _prompt(kind: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
    if kind == "text":
        return np.array([_scalar(inputs, "text_input")], dtype=object)
    ids = _flat(inputs, "input_ids").reshape(-1)
    if "input_lengths" in inputs:  # upstream reads the first input_lengths ids (a padded batch)
        n = int(_scalar(inputs, "input_lengths"))
        if not 0 < n <= ids.size:
            raise RequestError(f"input_lengths: {n} does not fit input_ids of {ids.size} tokens")
        ids = ids[:n]
    return ids.astype(np.int32)


def _sampling(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Upstream's sampling rule in dflash's terms. TensorRT-LLM's sampling layers turn top_k 0 with
    top_p 0 (the defaults when unset) into top_k 1, i.e. greedy whatever the temperature
    (cpp/tensorrt_llm/layers/topPSamplingLayer.cpp, setTopPRuntimeArgs), and its temperature
    defaults to 1.0; dflash reads temperature 0 as greedy and unset top_k / top_p as off."""
    values = {RENAMED.get(n, n): _scalar(inputs, n) for n in (*SAMPLING, *RENAMED) if n in inputs}
    top_k, top_p = int(values.get("top_k", 0)), float(values.get("top_p", 0.0))
    if top_k <= 1 and top_p == 0.0:
        return {"temperature": np.array([0.0], np.float32)}
    out = {"temperature": np.array([values.get("temperature", 1.0)], np.float32)}
    if top_k > 0:
        out["top_k"] = np.array([top_k], np.int32)
    if top_p > 0.0:
        out["top_p"] = np.array([top_p], np.float32)
    return out


def _seed(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    given = [n for n in ("seed", "random_seed") if n in inputs]
    if len(given) == 2:
        raise RequestError("random_seed: give seed or random_seed, not both")
    return {"seed": _flat(inputs, given[0]).reshape(-1).astype(np.uint64)} if given else {}


def _outputs(kind: str, inputs: dict[str, np.ndarray], requested: list[str] | None) -> list[str]:
    """The outputs to send: those the client asked for, else the main one, our statistics and the
    template outputs its return_* flags ask for."""
    if requested:
        return list(requested)
    return [n for n, (sent, _) in OUTPUTS_AS.items()
            if sent in ("always", kind, "batch") or (sent.startswith("return_") and _flag(inputs, sent, False))]


def is_last(outs: dict[str, np.ndarray]) -> bool:
    """A dflash response that completes its request (dflash sends its final flag with it)."""
    reason = outs.get("finish_reason")
    return reason is not None and bool(np.asarray(reason).reshape(-1)[0])


def _acceptance(one: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A request's acceptance so far: upstream's acceptance_rate (accepted / drafted, FP32) and our
    acceptance_histogram [max drafts + 1] (INT32), from a dflash response."""
    drafted, accepted = int(one["total_draft_tokens"][0]), int(one["total_accepted_draft_tokens"][0])
    out = {"acceptance_rate": np.array([accepted / drafted if drafted else 0.0], dtype=np.float32)}
    if "acceptance_histogram" in one:
        out["acceptance_histogram"] = one["acceptance_histogram"].astype(np.int32)
    return out


def to_dialect(fwd: Forward, outs: dict[str, np.ndarray], now_ns: int = 0) -> dict[str, np.ndarray]:
    """One dflash response (1-D tensors) as the dialect's outputs of `fwd`, sent at `now_ns`, shaped
    as upstream's models send them per response: text_output [beams] (its postprocessing model's
    OUTPUT), output_ids and output_log_probs [1, beams, tokens], the rest [1, 1] (batch-first)."""
    one = {n: np.asarray(v).reshape(-1) for n, v in outs.items()}
    fwd.first_ns = fwd.first_ns or now_ns
    total = int(one["total_output_tokens"][0])
    values = {n: one[n][:1] for n in STATS}
    values.update(_acceptance(one))
    values["num_output_tokens"] = np.array([total], dtype=np.int32)
    values["batch_index"] = np.array([fwd.batch_index], dtype=np.int32)
    for name, ns in (("arrival_time_ns", fwd.arrival_ns), ("first_token_time_ns", fwd.first_ns),
                     ("last_token_time_ns", now_ns)):
        values[name] = np.array([ns], dtype=np.int64)
    lps = one["output_log_probs"].astype(np.float32) if "output_log_probs" in one else np.zeros(0, np.float32)
    cum = float(one["cum_log_probs"][0]) if "cum_log_probs" in one else 0.0
    if fwd.kind == "text":
        text = bytes(one["text_output"][0])
        values["text_output"] = np.array([fwd.echo + text if fwd.echo is not None else text], dtype=object)
    else:
        _ids(fwd, one, values)
    if fwd.log_probs:  # upstream sends them to a request that set return_log_probs only
        values["output_log_probs"] = lps[None, :]  # [beam 1, tokens]
        values["cum_log_probs"] = np.array([cum], dtype=np.float32)
    sent = [n for n in fwd.outputs if n in values and (n != "batch_index" or fwd.batch_size > 1)]
    return {n: values[n] if n == "text_output" else values[n][None, ...] for n in sent}


def _ids(fwd: Forward, one, values) -> None:
    """The tensorrt_llm model's output_ids / sequence_length / num_input_tokens into `values`."""
    ids = one["output_ids"].astype(np.int32).tolist()
    if fwd.echo is not None:
        ids = list(fwd.echo) + ids
    values["output_ids"] = np.array([ids], dtype=np.int32)  # [beam 1, tokens]
    values["sequence_length"] = np.array([len(ids)], dtype=np.int32)
    values["num_input_tokens"] = np.array([fwd.inputs["input_ids"].size], dtype=np.int32)
