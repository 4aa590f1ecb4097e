"""Parse and validate one request of the `dflash` Triton model (pure; no Triton imports).

Triton has already checked tensor names and data types against config.pbtxt; this checks
values. Every problem raises `RequestError` with a message naming the input and what is
allowed, which the model returns as an error response (the server keeps serving).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trtllm_dflash.prompts.user import FALLBACK_CHAT_TEMPLATE, chat_prompt_ids  # noqa: F401  (the servers' chat rendering)


def __getattr__(name: str):
    """`MODES` (reference/generate.py), imported on first use: the dialect models' stubs
    (serve/dialect_model.py) load this module and need no torch."""
    if name == "MODES":
        from trtllm_dflash.reference.generate import MODES

        return MODES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class RequestError(ValueError):
    pass


def read_inputs(get_tensor, request, names) -> dict[str, np.ndarray]:
    """The inputs `names` a Triton request carries, as numpy arrays (absent optional ones left
    out); `get_tensor` is triton_python_backend_utils.get_input_tensor_by_name."""
    tensors = {name: get_tensor(request, name) for name in names}
    return {name: t.as_numpy() for name, t in tensors.items() if t is not None}


@dataclass(frozen=True)
class Limits:
    max_input_len: int  # prompt tokens
    max_seq_len: int  # prompt + output tokens


@dataclass
class GenerationRequest:
    prompt: str
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_words: list[str] = field(default_factory=list)
    stream: bool = False
    draft_len: int | None = None  # drafts per round for this request (0 = speculation off); None: the server's policy
    mode: str | None = None  # "ar" | "dflash" | "ddtree" for this request; None: the deployment's mode
    prompt_ids: list[int] | None = None  # input_ids: the prompt already tokenized (then `prompt` is "")
    end_id: int | None = None  # the token that ends the request; None: the target's eos ids
    skip_special_tokens: bool = False  # text_output leaves special tokens (eos) out
    # Token-level stop and bad words (tensorrtllm_backend's): text to tokenize, and token-id sequences.
    stop_sequences: list[str] = field(default_factory=list)
    stop_ids: list[list[int]] = field(default_factory=list)
    bad_words: list[str] = field(default_factory=list)
    bad_ids: list[list[int]] = field(default_factory=list)
    return_log_probs: bool = False
    skip_end_token: bool = False  # the end token that ends the request is left out of the output

    def token_words(self, encode) -> tuple[list[list[int]], list[list[int]]]:
        """(stop sequences, bad words) as token ids; `encode(word)` tokenizes a text word as
        tensorrtllm_backend's preprocessing does (no special tokens); words of no tokens are dropped."""
        stops = self.stop_ids + [ids for ids in map(encode, self.stop_sequences) if ids]
        return stops, self.bad_ids + [ids for ids in map(encode, self.bad_words) if ids]


def _scalar(inputs: dict[str, np.ndarray], name: str, kind: type):
    arr = inputs.get(name)
    if arr is None:
        return None
    flat = np.asarray(arr).reshape(-1)
    if flat.size != 1:
        raise RequestError(f"{name}: expected one value, got {flat.size}")
    value = flat[0]
    if kind is float and not np.issubdtype(flat.dtype, np.floating):
        raise RequestError(f"{name}: expected a floating-point value, got {flat.dtype}")
    if kind is int and not np.issubdtype(flat.dtype, np.integer):
        raise RequestError(f"{name}: expected an integer value, got {flat.dtype}")
    return kind(value)


def _text(value, name: str) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, (bytes, np.bytes_)):
        raise RequestError(f"{name}: expected BYTES (UTF-8 text), got {type(value).__name__}")
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(f"{name}: not valid UTF-8 (byte {e.start})") from None


def _prompt(inputs: dict[str, np.ndarray]) -> tuple[str, list[int] | None]:
    """The prompt: text (`text_input`) or token ids (`input_ids`, what the tensorrt_llm model forwards)."""
    text, ids = inputs.get("text_input"), inputs.get("input_ids")
    if text is not None and ids is not None:
        raise RequestError("text_input: give text_input or input_ids, not both")
    if ids is not None:
        arr = np.asarray(ids)
        if not np.issubdtype(arr.dtype, np.integer):
            raise RequestError(f"input_ids: expected integer token ids, got {arr.dtype}")
        if arr.size == 0:
            raise RequestError("input_ids: empty prompt")
        return "", [int(v) for v in arr.reshape(-1)]
    if text is None:
        raise RequestError("text_input: required")
    flat = np.asarray(text).reshape(-1)
    if flat.size != 1:
        raise RequestError(f"text_input: expected one prompt per request, got {flat.size}")
    prompt = _text(flat[0], "text_input")
    if not prompt:
        raise RequestError("text_input: empty prompt")
    return prompt, None


def parse_request(inputs: dict[str, np.ndarray]) -> GenerationRequest:
    """Values of one request; prompt length is checked after tokenization (`check_lengths`)."""
    prompt, prompt_ids = _prompt(inputs)
    max_tokens = _scalar(inputs, "max_tokens", int)
    if max_tokens is None:
        raise RequestError("max_tokens: required")
    if max_tokens <= 0:
        raise RequestError(f"max_tokens: must be > 0, got {max_tokens}")

    req = GenerationRequest(prompt=prompt, max_tokens=max_tokens, prompt_ids=prompt_ids)
    req.end_id = _scalar(inputs, "end_id", int)
    temperature = _scalar(inputs, "temperature", float)
    if temperature is not None:
        if not np.isfinite(temperature) or temperature < 0:
            raise RequestError(f"temperature: must be >= 0, got {temperature}")
        req.temperature = temperature
    top_p = _scalar(inputs, "top_p", float)
    if top_p is not None:
        if not (0.0 < top_p <= 1.0):
            raise RequestError(f"top_p: must be in (0, 1], got {top_p}")
        req.top_p = top_p
    top_k = _scalar(inputs, "top_k", int)
    if top_k is not None:
        if top_k < 0:
            raise RequestError(f"top_k: must be >= 0 (0 = off), got {top_k}")
        req.top_k = top_k
    seed = _scalar(inputs, "seed", int)
    if seed is not None:
        req.seed = seed
    draft_len = _scalar(inputs, "draft_len", int)
    if draft_len is not None:
        if draft_len < 0:
            raise RequestError(f"draft_len: must be >= 0 (0 = speculation off), got {draft_len}")
        req.draft_len = draft_len
    mode = inputs.get("mode")
    if mode is not None:
        from trtllm_dflash.reference.generate import MODES  # here: see __getattr__

        flat = np.asarray(mode).reshape(-1)
        if flat.size != 1:
            raise RequestError(f"mode: expected one value, got {flat.size}")
        req.mode = _text(flat[0], "mode").strip().lower()
        if req.mode not in MODES:
            raise RequestError(f"mode: expected one of {', '.join(MODES)}, got {req.mode!r}")
    stream = inputs.get("stream")
    if stream is not None:
        req.stream = bool(np.asarray(stream).reshape(-1)[0])
    skip = inputs.get("skip_special_tokens")
    if skip is not None:
        req.skip_special_tokens = bool(np.asarray(skip).reshape(-1)[0])
    exclude = inputs.get("exclude_input_in_output")
    if exclude is not None and not bool(np.asarray(exclude).reshape(-1)[0]):
        raise RequestError("exclude_input_in_output: only true is supported (the prompt is never echoed)")
    stop = inputs.get("stop_words")
    if stop is not None:
        req.stop_words = [w for w in (_text(v, "stop_words") for v in np.asarray(stop).reshape(-1)) if w]
    _token_words(inputs, req)
    return req


def _token_words(inputs: dict[str, np.ndarray], req: GenerationRequest) -> None:
    for name in ("stop_sequences", "bad_words"):
        if name in inputs:
            words = [w for w in (_text(v, name) for v in np.asarray(inputs[name]).reshape(-1)) if w]
            setattr(req, name, words)
    req.stop_ids = word_list(inputs["stop_words_list"], "stop_words_list") if "stop_words_list" in inputs else []
    req.bad_ids = word_list(inputs["bad_words_list"], "bad_words_list") if "bad_words_list" in inputs else []
    for name in ("return_log_probs", "skip_end_token"):
        flag = inputs.get(name)
        setattr(req, name, flag is not None and bool(np.asarray(flag).reshape(-1)[0]))


def word_list(arr, name: str) -> list[list[int]]:
    """Token sequences from tensorrtllm_backend's word-list layout: [2, N] (or [1, 2, N]), row 0 the
    sequences' ids one after another (0-padded), row 1 each sequence's cumulative end (-1-padded)."""
    a = np.asarray(arr)
    if a.ndim == 3 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 2 or a.shape[0] != 2 or not np.issubdtype(a.dtype, np.integer):
        raise RequestError(f"{name}: expected integer ids shaped [2, N] (ids; cumulative ends), got "
                           f"{a.dtype} {list(a.shape)}")
    ids, ends = a[0].tolist(), [int(e) for e in a[1].tolist() if e >= 0]
    if any(e2 <= e1 for e1, e2 in zip([0] + ends, ends)) or (ends and ends[-1] > len(ids)):
        raise RequestError(f"{name}: ends {ends} are not increasing within the {len(ids)} ids")
    return [ids[e1:e2] for e1, e2 in zip([0] + ends, ends)]


def check_mode(mode: str | None, ddtree_budget: int | None, field: str = "mode") -> None:
    """A request's mode is one the deployment can decode: ddtree needs the deployed recipe's
    speculative.ddtree_budget (the tree's node budget)."""
    if mode == "ddtree" and not ddtree_budget:
        raise RequestError(f"{field}: ddtree needs speculative.ddtree_budget in the deployed recipe; this deployment "
                           "has none (use dflash or ar)")


def check_decodable(capabilities, *, temperature: float = 0.0, bad_words: bool = False, logprobs: bool = False,
                    fields: tuple[str, str, str] = ("temperature", "bad_words", "return_log_probs")) -> None:
    """A request the loaded runners can decode (runtime/capabilities.py): sampling, bad words and
    log-probabilities need the full verify logits, which an argmax-only engine does not return.
    `fields`: the request's own names for temperature, bad words and log-probabilities."""
    if capabilities.full_logits:
        return
    asks = [(temperature > 0, fields[0], f"{temperature:g} samples", f"send {fields[0]} 0 (greedy)"),
            (bad_words, fields[1], "bad words mask the logits", f"leave {fields[1]} out"),
            (logprobs, fields[2], "log-probabilities score the logits", f"leave {fields[2]} out")]
    for asked, name, what, fix in asks:
        if asked:
            raise RequestError(f"{name}: {what}, which needs the full verify logits, and {capabilities.why_not}; {fix}")


def needs_full_logits(temperature: float, bad_words, logprobs) -> bool:
    """What check_decodable refuses on an argmax-only model (the serving engine asks it too)."""
    return temperature > 0 or bool(bad_words) or bool(logprobs)


def check_lengths(prompt_tokens: int, max_tokens: int, limits: Limits, prompt_field: str = "text_input",
                  max_tokens_field: str = "max_tokens") -> None:
    """The prompt and the output fit the build limits; messages name the request's own fields
    (the OpenAI server's are `prompt` / `messages` and `max_tokens` / `max_completion_tokens`)."""
    if prompt_tokens > limits.max_input_len:
        raise RequestError(
            f"{prompt_field}: prompt is {prompt_tokens} tokens, longer than the build limit max_input_len "
            f"{limits.max_input_len}"
        )
    room = limits.max_seq_len - prompt_tokens
    if max_tokens > room:
        raise RequestError(
            f"{max_tokens_field}: {max_tokens} > {room} (build limit max_seq_len {limits.max_seq_len} minus "
            f"{prompt_tokens} prompt tokens)"
        )


def check_token_ids(ids: list[int], vocab_size: int, field: str = "input_ids") -> None:
    """Token ids a client sent are in the vocabulary (one out of range would fail the whole batched
    round it joins, not just its own request)."""
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise RequestError(f"{field}: token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
