"""A CPU stand-in for TensorRT-LLM 1.2.1's Executor serving our DFlash target engine.

It has the Python bindings' shape (`tensorrt_llm.bindings.executor`: Executor.enqueue_request /
enqueue_requests / await_responses / cancel_request / shutdown; Request with output_config and a cache salt;
Result.additional_outputs) and models the 1.2.1 rules the engine runner depends on (upstream:
cpp/tensorrt_llm/batch_manager/utils/inflightBatchingUtils.cpp::copyAdditionalOutputs for the
additional-output rows, cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp for block reuse,
cpp/include/tensorrt_llm/executor/executor.h for the request fields; EngineLimits for the
limits, each rule citing its file):
  - every request is a context request (design C: drafts travel as prompt tokens, max_tokens 1);
  - KV-cache block reuse, only where the engine has paged context FMHA (otherwise the Executor
    switches it off): a request reuses the longest prefix of tokens an earlier request with the
    same cache salt already computed (whole blocks of tokens_per_block, or any prefix with
    partial reuse), never the last input token;
  - additional outputs: a `gather_context` output (one row per token, e.g. dflash_ctx)
    returns rows only for the positions that were computed, i.e. not reused; an output
    without it (one row per sequence, e.g. dflash_tail) returns that sequence's row;
    requesting an output the engine does not have, or one the ExecutorConfig did not register
    (its additional_model_outputs: `registered`, by default what runtime/trt_runners.py
    executor_config registers, recipe/plan/engine_memory.py EXECUTOR_OUTPUTS), is an error response;
  - a prompt longer than the Executor's max input length is an error response (the server keeps
    serving); prompt + max_tokens beyond max_seq_len is not an error: max_tokens is clamped;
  - one engine step packs queued requests in order up to max_num_tokens prompt tokens; the
    rest wait for the next step;
  - a step whose forward pass throws answers every active request with the same error,
    "Encountered an error in forwardAsync function: " + the exception's text, and the Executor
    serves on (cpp/tensorrt_llm/executor/executorImpl.cpp forwardAsync, terminateActiveRequests):
    the requests the step ran and those fetched but left for a later step, here every queued one
    up to max_batch_size;
  - a step that never ends (at tp > 1, the ranks whose step did not throw wait in its all-reduce
    for the one whose did: a stand-in engine raises StepNeverEnds) answers nothing, then or
    later: await_responses returns [] once its timeout has passed
    (cpp/tensorrt_llm/executor/executorImpl.cpp awaitResponses: a wait_for that times out),
    and without a timeout would wait for good, as would shutdown(), which joins the execution
    thread (the stand-in refuses both).
Outputs come back under their plain names, as runtime/trt_runners.TrtExecutor presents the real
executor's (`context_<name>` / `generation_<name>` in 1.2.1). Where 1.2.1 leaves reused context
rows unwritten in a [promptLen, ...] output, the stand-in returns only the computed rows;
TrtExecutor turns any reuse in a context-output request into an error, so either way
EngineTarget refuses such a prefill.
The engine itself is `engine.run(sequences) -> [{output name: tensor}]` over full token
sequences (the stand-in recomputes a sequence from scratch; what it *reports* follows the
reuse rules above). Tensor-parallel ranks are an engine concern (ShardedTapEngine).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from trtllm_dflash.recipe.plan.engine_layout import kv_reuse_honoured, requests_per_step, runtime_max_input_len
from trtllm_dflash.recipe.plan.engine_memory import EXECUTOR_OUTPUTS

# BuildConfig's max_num_tokens default (tensorrt_llm/builder.py), for an engine built without one.
DEFAULT_MAX_NUM_TOKENS = 8192
# How 1.2.1's Executor words a step that threw, to every request the step ran
# (cpp/tensorrt_llm/executor/executorImpl.cpp forwardAsync / forwardSync), the exception's text after it.
STEP_FAILED = ("Encountered an error in forwardAsync function: ", "Encountered an error in forwardSync function: ")


class StepNeverEnds(Exception):
    """Raised by a stand-in engine whose step would never return."""


@dataclass(frozen=True)
class AdditionalModelOutput:
    name: str
    gather_context: bool = False


@dataclass
class OutputConfig:
    additional_model_outputs: list[AdditionalModelOutput] = field(default_factory=list)
    exclude_input_from_output: bool = True


@dataclass
class Request:
    input_token_ids: list[int]
    max_tokens: int
    output_config: OutputConfig = field(default_factory=OutputConfig)
    cache_salt_id: int | None = None
    streaming: bool = False


@dataclass(frozen=True)
class AdditionalOutput:
    name: str
    output: torch.Tensor


@dataclass
class Result:
    output_token_ids: list[list[int]]  # per beam
    is_final: bool
    additional_outputs: list[AdditionalOutput]


@dataclass
class Response:
    request_id: int
    result: Result | None = None
    error_msg: str | None = None

    def has_error(self) -> bool:
        return self.error_msg is not None


@dataclass(frozen=True)
class EngineLimits:
    """What a 1.2.1 Executor takes from the target engine's build config, and its request rules."""

    max_seq_len: int
    max_input_len: int  # the engine's build_config max_input_len
    max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS
    context_fmha: bool = True
    paged_context_fmha: bool = True
    max_batch_size: int = 2048  # BuildConfig's default (tensorrt_llm/builder.py)

    @classmethod
    def from_build_config(cls, cfg: dict) -> "EngineLimits":
        """From a build_config.json / the engine config.json's build_config."""
        pc = cfg.get("plugin_config", {})
        return cls(cfg["max_seq_len"], cfg["max_input_len"], cfg.get("max_num_tokens") or DEFAULT_MAX_NUM_TOKENS,
                   bool(pc.get("context_fmha", True)), bool(pc.get("use_paged_context_fmha", True)),
                   cfg.get("max_batch_size") or 2048)

    @property
    def input_cap(self) -> int:
        """The longest prompt (trtGptModel.h; engine_layout.runtime_max_input_len)."""
        return runtime_max_input_len(max_seq_len=self.max_seq_len, max_input_len=self.max_input_len,
                                     max_num_tokens=self.max_num_tokens, context_fmha=self.context_fmha)

    def reuse(self, requested: bool) -> bool:
        """fixExecutorConfig: reuse only with paged context FMHA (engine_layout.kv_reuse_honoured)."""
        return kv_reuse_honoured(requested, paged_context_fmha=self.paged_context_fmha)

    def admit(self, prompt_len: int, max_tokens: int) -> tuple[str | None, int]:
        """LlmRequest::validate (cpp/tensorrt_llm/batch_manager/llmRequest.cpp): (error, max_tokens).
        Too long a prompt is an error; prompt + max_tokens past max_seq_len only clamps max_tokens
        (a warning: "Number of requested output tokens is changed to ...")."""
        if prompt_len > self.input_cap:
            return f"Prompt length ({prompt_len}) exceeds maximum input length ({self.input_cap}).", 0
        return None, min(max_tokens, self.max_seq_len - prompt_len)

    def step_size(self, prompt_lens: list[int]) -> int:
        """How many queued context requests (in order) one step takes: the scheduler's rule, one
        definition with the cost model's (recipe/plan/engine_layout.py STEP_RULE, requests_per_step)."""
        return requests_per_step(prompt_lens, self.max_num_tokens, self.max_batch_size)


class TapEngine(Protocol):
    """The target engine: full-sequence outputs, per token ('token') or per sequence ('sequence')."""

    output_kinds: dict[str, str]

    def run(self, sequences: list[list[int]]) -> list[dict[str, torch.Tensor]]:
        """For each sequence: 'logits' at its last position [V], and every additional output
        (per-token outputs [len, ...], per-sequence outputs [...])."""


def cached_prefix(cached: list[list[int]], tokens: list[int]) -> int:
    """How many leading `tokens` a cached sequence already holds, at most len(tokens) - 1: the last
    input token is always computed (its logits)."""
    best = 0
    for seq in cached:
        best = max(best, next((i for i, (a, b) in enumerate(zip(seq, tokens)) if a != b), min(len(seq), len(tokens))))
    return min(best, len(tokens) - 1)


def take_step(queue: dict, limits: EngineLimits, steps: list[int]) -> list:
    """Pop the queued (id, request) pairs of one engine step (as many as fit max_num_tokens, in
    order) and record the step's prompt tokens in `steps`."""
    queued = list(queue.items())
    batch = queued[: limits.step_size([len(r.input_token_ids) for _, r in queued])]
    for rid, _ in batch:
        del queue[rid]
    steps.append(sum(len(r.input_token_ids) for _, r in batch))
    return batch


class FakeExecutor:
    """tensorrt_llm.bindings.executor.Executor of TensorRT-LLM 1.2.1 (cpp/include/tensorrt_llm/
    executor/executor.h) over a TapEngine, with the rules of the module docstring."""

    def __init__(self, engine: TapEngine, *, max_seq_len: int, max_input_len: int,
                 max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS, context_fmha: bool = True,
                 paged_context_fmha: bool = True,
                 tokens_per_block: int = 32, enable_block_reuse: bool = True, enable_partial_reuse: bool = True,
                 registered: tuple[str, ...] = EXECUTOR_OUTPUTS):
        self.engine, self.registered = engine, tuple(registered)
        self.limits = EngineLimits(max_seq_len, max_input_len, max_num_tokens, context_fmha, paged_context_fmha)
        self.tokens_per_block, self.partial = tokens_per_block, enable_partial_reuse
        self.reuse = self.limits.reuse(enable_block_reuse)
        self._ids = itertools.count(1)
        self._queue: dict[int, Request] = {}
        self._done: dict[int, Response] = {}
        self._cached: dict[int | None, list[list[int]]] = {}  # cache salt -> token sequences with KV blocks
        self.requests = 0  # requests served (for tests and stats)
        self.stuck = False  # a step never ended (StepNeverEnds): nothing is answered any more
        self.reused_tokens = 0  # prompt tokens that KV reuse saved
        self.steps: list[int] = []  # prompt tokens of each engine step

    def enqueue_request(self, request: Request) -> int:
        rid = next(self._ids)
        names = [o.name for o in request.output_config.additional_model_outputs]
        unknown = [n for n in names if n not in self.engine.output_kinds]
        unbound = [n for n in names if n not in self.registered]
        error, _ = self.limits.admit(len(request.input_token_ids), request.max_tokens)
        if unknown:
            self._done[rid] = Response(rid,
                                       error_msg=f"additional output {unknown[0]!r} is not an output of the engine")
        elif unbound:
            self._done[rid] = Response(rid,
                                       error_msg=f"additional output {unbound[0]!r} is not in the ExecutorConfig's "
                                                      "additional_model_outputs")
        elif error is not None:
            self._done[rid] = Response(rid, error_msg=error)
        else:
            self._queue[rid] = request
        return rid

    def enqueue_requests(self, requests: list[Request]) -> list[int]:
        """Executor.enqueue_requests(requests) -> their ids, in order (1.2.1's binding,
        cpp/tensorrt_llm/nanobind/executor/executor.cpp): each as enqueue_request would take it, all
        queued before the next step packs its batch."""
        return [self.enqueue_request(r) for r in requests]

    def cancel_request(self, rid: int) -> None:
        self._queue.pop(rid, None)

    def _reused(self, salt: int | None, tokens: list[int]) -> int:
        if not self.reuse:
            return 0
        best = cached_prefix(self._cached.get(salt, []), tokens)
        return best if self.partial else best - best % self.tokens_per_block

    def _step(self) -> None:
        """One engine step over the queued context requests that fit max_num_tokens."""
        if not self._queue:
            return
        batch = take_step(self._queue, self.limits, self.steps)
        try:
            outs = self.engine.run([r.input_token_ids for _, r in batch])
        except StepNeverEnds:
            self.stuck = True
            return
        except Exception as e:  # every active request ends with it; the next step runs
            active = [rid for rid, _ in batch] + list(self._queue)[: max(0, self.limits.max_batch_size - len(batch))]
            for rid in active:
                self._queue.pop(rid, None)
                self._done[rid] = Response(rid, error_msg=f"{STEP_FAILED[0]}{e}")
            return
        for (rid, req), out in zip(batch, outs):
            reused = self._reused(req.cache_salt_id, req.input_token_ids)
            extra = []
            for o in req.output_config.additional_model_outputs:
                t = out[o.name]
                if self.engine.output_kinds[o.name] == "token":
                    # context outputs cover the computed (not reused) positions only
                    t = t[reused:] if o.gather_context else t[-1:]
                extra.append(AdditionalOutput(o.name, t))
            token = int(out["logits"].argmax())  # the executor's own greedy token (max_tokens == 1)
            self._cached.setdefault(req.cache_salt_id, []).append(list(req.input_token_ids))
            self.requests += 1
            self.reused_tokens += reused
            self._done[rid] = Response(rid, Result([[token]], True, extra))

    def await_responses(self, request_id: int, timeout_s: float | None = None) -> list[Response]:
        while request_id not in self._done and request_id in self._queue and not self.stuck:
            self._step()
        if request_id not in self._done and self.stuck:
            if timeout_s is None:
                raise RuntimeError("await_responses without a timeout would wait for good: the Executor's step never "
                                   "ends")
            time.sleep(timeout_s)
            return []
        return [self._done.pop(request_id)]

    def release_salt(self, salt: int) -> None:
        """The salt's sequences are finished: their blocks may be evicted (the stand-in frees them)."""
        self._cached.pop(salt, None)

    def shutdown(self) -> None:
        if self.stuck:  # executorImpl.cpp shutdown joins the execution thread, which is in the stuck step
            raise RuntimeError("Executor.shutdown would wait for good: its execution thread never leaves the step")
        self._queue.clear()
