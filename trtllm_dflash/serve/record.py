"""The response record: what a front end submits (`Request`), and what each of its responses
carries (`Update`, with the request's speculative decoding so far as one value, `SpecStats`).

The serving engine (batcher.py) builds them; every front end renders them in its own wire
format: the OpenAI server (openai_responses.py), the `dflash` Triton model (triton_outputs.py)
and, through that model's tensors, tensorrtllm_backend's dialect (dialect.py). A per-request
value that every front end reports is computed here once, and each renderer says where it goes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from trtllm_dflash.reference.verify import SamplingParams

_new = object.__new__


def _tuples(words: Sequence[Sequence[int]] | None) -> tuple[tuple[int, ...], ...] | None:
    return None if words is None else tuple(tuple(w) for w in words)


@dataclass(frozen=True)
class Request:
    """One request as a front end submits it: what it asks for and where its updates go."""

    prompt_ids: Sequence[int]
    max_tokens: int
    emit: Callable[["Update"], None]  # called on the engine thread, once per update
    sampling: SamplingParams = SamplingParams()
    stop_token_ids: Sequence[int] | None = None  # None: the target's eos ids
    stop_words: Sequence[str] = ()
    cancelled: Callable[[], bool] = lambda: False
    draft_len: int | None = None  # this request's drafts per round (0 = speculation off); None: the policy's
    mode: str | None = None  # this request's decoding: "ar" | "dflash" | "ddtree"; None: the engine's mode
    tag: str = ""  # the front end's id of the request (timestamps of serve/trace.py name it)
    skip_special_tokens: bool = False  # the text leaves special tokens (eos) out
    bad_words: Sequence[Sequence[int]] | None = None  # token sequences never in the output (reference/token_rules.py)
    stop_sequences: Sequence[Sequence[int]] = ()  # token sequences that end it, kept in the output
    logprobs: bool = False  # updates carry the committed tokens' log-probabilities
    skip_end_token: bool = False  # the stop token that ends it is left out of its output (TensorRT-LLM's executor)

    def __post_init__(self):
        # Immutable all the way down: a front end cannot change a request the engine is decoding.
        set_ = object.__setattr__
        set_(self, "prompt_ids", tuple(self.prompt_ids))
        set_(self, "stop_token_ids", None if self.stop_token_ids is None else tuple(self.stop_token_ids))
        set_(self, "stop_words", tuple(self.stop_words))
        set_(self, "bad_words", _tuples(self.bad_words))
        set_(self, "stop_sequences", _tuples(self.stop_sequences))


@dataclass(frozen=True)
class SpecStats:
    """A request's speculative decoding so far: kept by the round loop, carried on every update
    to every front end (OpenAI's `speculative_decoding`, the Triton outputs)."""

    rounds: int = 0  # target verify passes (the prefill is not one)
    drafted: int = 0  # draft tokens verified (DDTree: tree nodes)
    accepted: int = 0  # draft tokens accepted
    # [max drafts + 1] verify passes by the drafts they accepted: histogram[j] = passes that accepted
    # exactly j (sum = rounds, sum of j * histogram[j] = accepted); TensorRT-LLM PR #19311's shape
    histogram: tuple[int, ...] = ()
    # draft tokens along each pass's draft path: `drafted` for a chain; a DDTree pass of n nodes over
    # the drafter's block_size - 1 slots is at most min(n, slots) deep (PR #19311 counts tree paths so)
    path_drafted: int = 0
    plain: int = 0  # verify passes that verified no drafts (AR, or a policy's 0): in histogram[0] too

    @classmethod
    def start(cls, histogram_len: int) -> "SpecStats":
        """Nothing verified yet; a histogram of `histogram_len` (max drafts + 1) zeros."""
        return cls(histogram=(0,) * histogram_len)

    def verified(self, drafted: int, accepted: int, path: int | None = None) -> "SpecStats":
        """These statistics after one more verify pass that verified `drafted` drafts (`path` of
        them along its draft path; default all) and accepted `accepted`."""
        hist = self.histogram
        if accepted >= len(hist):
            hist += (0,) * (accepted + 1 - len(hist))
        hist = (*hist[:accepted], hist[accepted] + 1, *hist[accepted + 1:])
        # every field set at once into the frozen instance's __dict__: this runs per request per
        # round, and the generated __init__ (one object.__setattr__ per field) costs 3-4x as much
        out = _new(SpecStats)
        out.__dict__.update(rounds=self.rounds + 1, drafted=self.drafted + drafted, accepted=self.accepted + accepted,
                            histogram=hist, path_drafted=self.path_drafted + (drafted if path is None else path),
                            plain=self.plain + (drafted == 0))
        return out

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted so far (0 when nothing was drafted), as TensorRT-LLM reports it."""
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass(frozen=True)
class Update:
    """What one response carries."""

    text: str  # new text since the previous update ("" while a character's bytes are incomplete)
    total_tokens: int  # tokens of the output so far
    finish_reason: str | None  # None while running, then "stop" | "length" | "cancelled" | "error: ..."
    spec: SpecStats = field(default_factory=SpecStats)
    ids: tuple[int, ...] = ()  # the tokens committed in this update
    logprobs: tuple[float, ...] | None = None  # their log-probabilities under the target (a request with logprobs)
    cum_logprob: float = 0.0  # the sum over every token so far

    @classmethod
    def of(cls, text: str, total_tokens: int, finish_reason: str | None, spec: SpecStats, ids: tuple[int, ...],
           logprobs: tuple[float, ...] | None, cum_logprob: float) -> "Update":
        """Update(...) with every field given, as the round loop builds one per request per round:
        set at once into the frozen instance's __dict__ (the generated __init__ costs 3-4x as much)."""
        out = _new(cls)
        out.__dict__.update(text=text, total_tokens=total_tokens, finish_reason=finish_reason, spec=spec, ids=ids,
                            logprobs=logprobs, cum_logprob=cum_logprob)
        return out

    @property
    def tokens(self) -> int:
        """Tokens committed in this update."""
        return len(self.ids)

    @property
    def acceptance_length(self) -> float:
        """tau so far: tokens committed per verify pass (the prefill's first token excluded)."""
        return (self.total_tokens - 1) / self.spec.rounds if self.spec.rounds else 0.0

    @property
    def avg_decoded_tokens_per_iter(self) -> float:
        """Output tokens per iteration so far, the prefill counting as one (0 before it), as TensorRT-LLM
        reports it: generated tokens / decoding iterations (cpp/include/tensorrt_llm/batch_manager/
        llmRequest.h getAvgDecodedTokensPerIter; its samplers count a request's context step as an
        iteration, tensorrt_llm/_torch/pyexecutor/sampler.py; NVIDIA/TensorRT-LLM main at 0076e939)."""
        return self.total_tokens / (self.spec.rounds + 1) if self.total_tokens else 0.0


def draft_bound(engine, mode: str) -> int | None:
    """The most drafts one verify pass of a `mode` request may verify on this serving engine
    (batcher.ServingEngine): the drafter's block size - 1; None where the engine's draft-length
    policy chooses per pass for that mode (TensorRT-LLM PR #19311's num_spec_tokens: the server's
    max_draft_len, None under a draft_len_schedule)."""
    if mode in engine.policy.modes:
        return None
    return engine.histogram_len - 1
