"""A stand-in for `tensorrt_llm.bindings.executor` (TensorRT-LLM 1.2.1's nanobind module) with the
signatures of cpp/tensorrt_llm/nanobind/executor/{request,executorConfig}.cpp (Request takes
everything after max_tokens by keyword; OutputConfig / AdditionalModelOutput keywords) and the
result conventions of the C++ batch manager: additional outputs named "context_<name>"
([promptLen, ...], reused rows unwritten) and "generation_<name>" ([beam, maxNewTokens, ...])
(batch_manager/llmRequest.cpp createResult, llmRequest.h allocAdditionalOutputs); KV reuse per
cache salt in whole blocks, reported in request_perf_metrics.kv_cache_metrics.num_reused_blocks.

The Executor's limits are the engine's (its config.json build_config, `build_config=`), with the
1.2.1 rules of runtime/fake_executor.py EngineLimits (one definition, each rule citing its C++
file): reuse only with paged context FMHA (trtGptModelInflightBatching.cpp fixExecutorConfig),
prompts up to the runtime max input length and max_tokens clamped at max_seq_len
(trtGptModel.h, llmRequest.cpp LlmRequest::validate), steps of at most max_num_tokens
(microBatchScheduler.cpp).

Parallelism (ParallelConfig(communication_type, communication_mode, device_ids, participant_ids,
orchestrator_config, num_nodes), executorConfig.cpp at 008b2b8d; num_nodes is a keyword there,
a first-GPU check for the 1.2.1 wheel): `world_rank` stands in for this process's MPI rank, and
can_enqueue_requests() answers as executorImpl.cpp (b35ac1b6) canEnqueueRequests: in leader mode
only the leader, the first participant (participants default to every rank) takes requests; in
orchestrator mode only the orchestrator. A non-leader's shutdown() returns at once here (the
real one blocks until the leader's terminate request reaches the execution thread).

The engine is a runtime/engine_runners.py TapEngine (full-sequence outputs by name).
"""

from __future__ import annotations

import datetime
import enum
import itertools
from types import SimpleNamespace

from trtllm_dflash.runtime.fake_executor import EngineLimits, cached_prefix, take_step

# An engine built with paged context FMHA and room to spare, for tests that do not probe limits.
ROOMY_ENGINE = {"max_seq_len": 4096, "max_input_len": 4095, "max_num_tokens": 8192,
                "plugin_config": {"context_fmha": True, "use_paged_context_fmha": True}}


class CommunicationType(enum.Enum):
    MPI = 0


class CommunicationMode(enum.Enum):
    LEADER = 0
    ORCHESTRATOR = 1


class ModelType(enum.Enum):
    DECODER_ONLY = 0


class AdditionalModelOutput:
    def __init__(self, name, gather_context=False):
        self.name, self.gather_context = name, gather_context


class OutputConfig:
    def __init__(self, return_log_probs=None, return_context_logits=None, return_generation_logits=None,
                 exclude_input_from_output=None, return_encoder_output=None, return_perf_metrics=None,
                 additional_model_outputs=None):
        self.exclude_input_from_output = bool(exclude_input_from_output)
        self.return_perf_metrics = bool(return_perf_metrics)
        self.additional_model_outputs = additional_model_outputs


class Request:
    def __init__(self, input_token_ids, max_tokens, *, streaming=False, sampling_config=None, output_config=None,
                 end_id=None, pad_id=None, cache_salt_id=None):
        assert isinstance(input_token_ids, list) and all(isinstance(t, int) for t in input_token_ids)
        self.input_token_ids, self.max_tokens, self.streaming = input_token_ids, max_tokens, streaming
        self.output_config, self.cache_salt_id = output_config or OutputConfig(), cache_salt_id


class KvCacheConfig:
    def __init__(self, enable_block_reuse=True, max_tokens=None, max_attention_window=None, sink_token_length=None,
                 free_gpu_memory_fraction=None, *, enable_partial_reuse=True, copy_on_partial_reuse=True):
        self.enable_block_reuse, self.free_gpu_memory_fraction = enable_block_reuse, free_gpu_memory_fraction


class OrchestratorConfig:
    def __init__(self, is_orchestrator=True, worker_executable_path="", orch_leader_comm=None, spawn_processes=True):
        self.is_orchestrator, self.worker_executable_path = is_orchestrator, worker_executable_path


class ParallelConfig:
    def __init__(self, communication_type=CommunicationType.MPI, communication_mode=CommunicationMode.LEADER,
                 device_ids=None, participant_ids=None, orchestrator_config=None, num_nodes=None):
        self.communication_type, self.communication_mode = communication_type, communication_mode
        self.device_ids, self.participant_ids = device_ids, participant_ids
        self.orchestrator_config, self.num_nodes = orchestrator_config, num_nodes


class ExecutorConfig:
    def __init__(self, max_beam_width=1, scheduler_config=None, kv_cache_config=None, enable_chunked_context=False,
                 normalize_log_probs=True, iter_stats_max_iterations=1000, request_stats_max_iterations=0,
                 batching_type=None, max_batch_size=None, max_num_tokens=None, parallel_config=None,
                 additional_model_outputs=None, gather_generation_logits=False):
        self.max_beam_width, self.kv_cache_config = max_beam_width, kv_cache_config
        self.enable_chunked_context, self.parallel_config = enable_chunked_context, parallel_config
        self.additional_model_outputs = additional_model_outputs


class _Response:
    def __init__(self, request_id, result=None, error_msg=None):
        self.request_id, self.result, self._error = request_id, result, error_msg

    def has_error(self):
        return self._error is not None

    @property
    def error_msg(self):
        return self._error


class Executor:
    """Runs queued requests when a response is awaited: engine steps of at most max_num_tokens prompt
    tokens (every request a context request), after 1.2.1's admission rules."""

    def __init__(self, engine, model_type=ModelType.DECODER_ONLY, config=None, *, tokens_per_block=4,
                 build_config=ROOMY_ENGINE, world_rank=0):
        self.engine, self.config, self.tokens_per_block = engine, config or ExecutorConfig(), tokens_per_block
        self.world_rank, self.shutdown_called = world_rank, False
        self.limits = EngineLimits.from_build_config(build_config)
        kv = self.config.kv_cache_config
        self.reuse = self.limits.reuse(kv.enable_block_reuse if kv is not None else True)  # KvCacheConfig's default
        self.bound = {o.name for o in (self.config.additional_model_outputs or [])}
        self._ids = itertools.count(1)
        self._queue, self._done, self._cached = {}, {}, {}
        self.requests: list[Request] = []
        self.steps: list[int] = []

    def enqueue_request(self, request: Request) -> int:
        rid = next(self._ids)
        self.requests.append(request)
        error, request.max_tokens = self.limits.admit(len(request.input_token_ids), request.max_tokens)
        if error is not None:
            self._done[rid] = _Response(rid, error_msg=error)
        else:
            self._queue[rid] = request
        return rid

    def enqueue_requests(self, requests: list[Request]) -> list[int]:
        """executor.cpp's enqueue_requests(requests): their ids, every one queued before a step runs."""
        return [self.enqueue_request(r) for r in requests]

    def _reused_blocks(self, salt, tokens) -> int:
        if not self.reuse:
            return 0
        return cached_prefix(self._cached.get(salt, []), tokens) // self.tokens_per_block

    def _step(self):
        batch = take_step(self._queue, self.limits, self.steps)
        outs = self.engine.run([r.input_token_ids for _, r in batch])
        for (rid, req), out in zip(batch, outs):
            self._done[rid] = self._respond(rid, req, out)

    def _respond(self, rid, req, out):
        blocks = self._reused_blocks(req.cache_salt_id, req.input_token_ids)
        extra = []
        for o in req.output_config.additional_model_outputs or []:
            if o.name not in self.bound:
                return _Response(rid, error_msg=f"additional output {o.name} is not in the ExecutorConfig")
            t = out[o.name]
            if o.gather_context:
                ctx = t.clone()
                ctx[: blocks * self.tokens_per_block] = 0  # reused rows are never written
                extra.append(SimpleNamespace(name="context_" + o.name, output=ctx))
                t = t[-1]  # the last context row is also the first generation step's
            extra.append(SimpleNamespace(name="generation_" + o.name, output=t[None, None]))
        self._cached.setdefault(req.cache_salt_id, []).append(list(req.input_token_ids))
        metrics = SimpleNamespace(kv_cache_metrics=SimpleNamespace(num_reused_blocks=blocks))
        return _Response(rid, SimpleNamespace(output_token_ids=[[int(out["logits"].argmax())]], is_final=True,
                                              additional_outputs=extra,
                                              request_perf_metrics=metrics if req.output_config.return_perf_metrics
                                              else None))

    def await_responses(self, id, timeout=None):  # the binding's argument names
        # executor.cpp: timeout is a std::optional<std::chrono::milliseconds>; nanobind/stl/chrono.h
        # takes a datetime.timedelta (what runtime/trt_runners.py passes) or a float of seconds, not an
        # int. It times out with [].
        if timeout is not None and not isinstance(timeout, (datetime.timedelta, float)):
            raise TypeError(f"await_responses(): incompatible function arguments: timeout={timeout!r}")
        while id not in self._done and id in self._queue:
            self._step()
        return [self._done.pop(id)]

    def cancel_request(self, request_id):
        self._queue.pop(request_id, None)

    def can_enqueue_requests(self):
        pc = self.config.parallel_config
        if self.shutdown_called:
            return False
        if pc is None:
            return True
        if pc.communication_mode is CommunicationMode.ORCHESTRATOR:
            return pc.orchestrator_config.is_orchestrator
        return self.world_rank == (pc.participant_ids or [0])[0]

    def shutdown(self):
        self.shutdown_called = True
        self._queue.clear()


def module() -> SimpleNamespace:
    """The stand-in as a module-like namespace (what trt_runners takes as `bindings`)."""
    return SimpleNamespace(**{n: globals()[n] for n in (
        "CommunicationType", "CommunicationMode", "ModelType", "AdditionalModelOutput", "OutputConfig", "Request",
        "KvCacheConfig", "OrchestratorConfig", "ParallelConfig", "ExecutorConfig", "Executor")})
