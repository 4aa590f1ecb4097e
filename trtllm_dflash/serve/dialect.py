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
(clients send neutral defaults). The tables: every input the models declare and what happens to
it in serve/dialect_inputs.py (`refusal`, `handled`), every output in serve/dialect_outputs.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trtllm_dflash.serve.dialect_inputs import NAMES, PASSED, RENAMED, SAMPLING, WORDS, refusal
from trtllm_dflash.serve.dialect_outputs import DFLASH_OUTPUTS, LOG_PROBS, OUTPUTS_AS, STATS
from trtllm_dflash.serve.requests import RequestError


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
        return [n for n in DFLASH_OUTPUTS if (n != "output_ids" or self.kind == "ids")
                and (n not in LOG_PROBS or self.log_probs)]


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


def to_dialect(fwd: Forward, outs: dict[str, np.ndarray], now_ns: int = 0) -> dict[str, np.ndarray]:
    """One dflash response (1-D tensors) as the dialect's outputs of `fwd`, sent at `now_ns`, shaped
    as upstream's models send them per response: text_output [beams] (its postprocessing model's
    OUTPUT), output_ids and output_log_probs [1, beams, tokens], the rest [1, 1] (batch-first)."""
    one = {n: np.asarray(v).reshape(-1) for n, v in outs.items()}
    fwd.first_ns = fwd.first_ns or now_ns
    total = int(one["total_output_tokens"][0])
    values = {n: one[n][:1] for n in STATS}
    if "acceptance_histogram" in one:  # [max drafts + 1]
        values["acceptance_histogram"] = one["acceptance_histogram"].astype(np.int32)
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
