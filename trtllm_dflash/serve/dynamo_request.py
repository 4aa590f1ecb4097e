"""A Dynamo request as our request record, and what a finished one reports back: the worker
front end's semantics (serve/dynamo.py), apart from Dynamo itself (no dynamo imports here).

Dynamo's frontend tokenizes the prompt (chat: with the template the worker registered) and hands
the worker a `GenerateRequest` (ai-dynamo 1.6.1 dynamo/common/backend/engine.py; the keys as its
frontend fills them, observed): token_ids; stop_conditions {max_tokens, stop, stop_token_ids,
stop_token_ids_hidden, stop_token_ids_visible, min_tokens, ignore_eos, max_thinking_tokens};
sampling_options {n, best_of, presence_penalty, frequency_penalty, repetition_penalty,
temperature, top_p, top_k, min_p, use_beam_search, length_penalty, seed,
include_stop_str_in_output, guided_decoding}; output_options {logprobs, prompt_logprobs, ...};
eos_token_ids; annotations (the request's `nvext.annotations`); extra_args {"nvext": ...}.

What our OpenAI server refuses is refused here too, naming the OpenAI field (RequestError; the
worker raises it as Dynamo's InvalidArgument, HTTP 400 through the frontend), and so is what the
loaded runners cannot decode (requests.check_decodable). Stop strings and hidden stop tokens are
also the frontend's: it trims the text it detokenizes from our token ids.

Per-request decoding (AR beside DFlash on one worker): Dynamo's frontend refuses unknown `nvext`
keys and unknown top-level fields (HTTP 400), so our OpenAI server's request extension `dflash`
cannot pass; `nvext.annotations`, free strings it forwards to the worker, carry it instead:
`"nvext": {"annotations": ["dflash.mode=ar", "dflash.draft_len=3"]}` (`decoding`; the sweep writes
them: sweep/protocols.py dynamo_annotations).
A finished request reports back in `engine_data` (`engine_data`), which the frontend returns as
`nvext.engine_data` when the request asks `"nvext": {"extra_fields": ["engine_data"]}`.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_dflash.reference.verify import SamplingParams
from trtllm_dflash.serve.requests import (
    Limits,
    RequestError,
    check_decodable,
    check_lengths,
    check_mode,
    check_token_ids,
)

ANNOTATION = "dflash."  # nvext.annotations of ours: "dflash.<key>=<value>"
KEYS = ("mode", "draft_len")


def decoding(notes) -> tuple[str | None, int | None]:
    """(mode, draft_len) a request's annotations ask for; other annotations are Dynamo's own."""
    from trtllm_dflash.serve.requests import MODES

    asked = {}
    for note in notes or ():
        if not isinstance(note, str) or not note.startswith(ANNOTATION):
            continue
        key, eq, value = note[len(ANNOTATION):].partition("=")
        if key not in KEYS or not eq:
            raise RequestError(f"nvext.annotations: {note!r}: expected dflash.mode=ar|dflash|ddtree or "
                               "dflash.draft_len=N")
        asked[key] = value.strip()
    mode, draft_len = asked.get("mode"), asked.get("draft_len")
    if mode is not None and mode not in MODES:
        raise RequestError(f"nvext.annotations: dflash.mode={mode}: expected one of {', '.join(MODES)}")
    if draft_len is not None:
        if not draft_len.isdigit():
            raise RequestError(f"nvext.annotations: dflash.draft_len={draft_len}: expected an integer >= 0")
        draft_len = int(draft_len)
    return mode, draft_len


@dataclass(frozen=True)
class Asked:
    """What one Dynamo request asks of the serving engine."""

    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop_words: tuple[str, ...]
    stop_token_ids: tuple[int, ...] | None  # None: the target's eos ids
    mode: str | None
    draft_len: int | None


# sampling_options / output_options / stop_conditions fields that would change the result, refused
# unless neutral, by their OpenAI names (our OpenAI server refuses the same: openai_bodies._REFUSED)
_NEUTRAL = {"presence_penalty": (0,), "frequency_penalty": (0,), "repetition_penalty": (1,), "min_p": (0,),
            "length_penalty": (1,), "min_tokens": (0,), "use_beam_search": (False,), "guided_decoding": (),
            "logprobs": (False,), "prompt_logprobs": (False,)}


@dataclass(frozen=True)
class Served:
    """What the worker serves, as far as a request's checks go."""

    limits: Limits
    vocab_size: int
    capabilities: object  # runtime/capabilities.Capabilities of the loaded runners
    ddtree_budget: int | None

    def parse(self, request: dict) -> Asked:
        """The request as the engine takes it; RequestError naming the field for anything refused."""
        sampling, stops = request.get("sampling_options") or {}, request.get("stop_conditions") or {}
        output = request.get("output_options") or {}
        _refuse(sampling, output, stops)
        ids = list(request.get("token_ids") or [])
        if not ids:
            raise RequestError("prompt: empty prompt")
        check_token_ids(ids, self.vocab_size, "prompt")
        max_tokens = stops.get("max_tokens") or max(1, self.limits.max_seq_len - len(ids))
        check_lengths(len(ids), max_tokens, self.limits, prompt_field="prompt")
        params = self._sampling(sampling)
        check_decodable(self.capabilities, temperature=params.temperature)
        mode, draft_len = decoding(request.get("annotations"))
        check_mode(mode, self.ddtree_budget, "nvext.annotations: dflash.mode")
        return Asked(ids, max_tokens, params, tuple(w for w in stops.get("stop") or () if w), _stop_ids(stops), mode,
                     draft_len)

    def _sampling(self, s: dict) -> SamplingParams:
        temperature = s.get("temperature")
        if temperature is None:  # OpenAI's default where the runners sample, as our OpenAI server
            temperature = 1.0 if self.capabilities.full_logits else 0.0
        top_p = 1.0 if s.get("top_p") is None else float(s["top_p"])
        top_k = s.get("top_k") or 0
        if temperature < 0:
            raise RequestError(f"temperature: must be >= 0, got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise RequestError(f"top_p: must be in (0, 1], got {top_p}")
        if top_k < -1:
            raise RequestError(f"top_k: must be >= 0 (0 or -1 = off), got {top_k}")
        seed = s.get("seed")
        return SamplingParams(temperature=float(temperature), top_p=top_p, top_k=max(0, int(top_k)),
                              seed=0 if seed is None else int(seed))


def _refuse(sampling: dict, output: dict, stops: dict) -> None:
    n = sampling.get("n")
    if n not in (None, 1):
        raise RequestError(f"n: {n} > 1: this worker returns one choice per request")
    if sampling.get("best_of") not in (None, 1):
        raise RequestError("best_of: only 1 is supported")
    given = {**sampling, **output, **stops}
    for name, neutral in _NEUTRAL.items():  # 0 == False: logprobs 0 asks for none
        value = given.get(name)
        if value is not None and value not in neutral:
            only = f" (only {neutral[0]})" if neutral and not isinstance(neutral[0], bool) else ""
            raise RequestError(f"{name}: not supported{only}")


def _stop_ids(stops: dict) -> tuple[int, ...] | None:
    """The tokens that end the request: the frontend's (eos_token_ids become stop_token_ids_hidden,
    none with ignore_eos), else None, the target's eos ids. The frontend hides the hidden ones."""
    lists = [stops.get(k) for k in ("stop_token_ids_hidden", "stop_token_ids_visible", "stop_token_ids")]
    if all(v is None for v in lists):
        return None
    return tuple(dict.fromkeys(int(t) for v in lists for t in v or ()))


def finish_reason(reason: str) -> str:
    """Ours ("stop" | "length" | "cancelled") as Dynamo's (1.6.1: eos, length, stop, error, cancelled)."""
    return reason if reason in ("stop", "length", "cancelled") else "error"


def engine_data(update, mode: str, draft_len: int | None, num_spec_tokens: int | None) -> dict:
    """A finished request's `engine_data`: our OpenAI server's per-choice `speculative_decoding`
    (TensorRT-LLM PR #19311's, left out where nothing was drafted) and `avg_decoded_tokens_per_iter`,
    and its top-level `dflash`, which Dynamo's own responses have no place for."""
    from trtllm_dflash.serve.openai_responses import decoded, speculative_decoding

    spec = speculative_decoding(update.spec, num_spec_tokens)
    data = {"speculative_decoding": spec.model_dump()} if spec is not None else {}
    return {**data, "avg_decoded_tokens_per_iter": update.avg_decoded_tokens_per_iter,
            "dflash": decoded(mode, draft_len, update.spec).model_dump()}
