"""The engine backend's TensorRT runners (GPU-only: tensorrt / tensorrt_llm are imported inside the
functions, so this module imports on CPU and its logic is tested there with stand-ins).

  executor_config / open_executor   the target engine's TensorRT-LLM 1.2.1 Executor
  TrtExecutor     that Executor behind the interface EngineTarget (serve/engine_runners.py)
                  drives, FakeExecutor's: requests in, responses with the DFlash outputs by name
  TrtSession      the drafter engine on the TensorRT runtime, a DrafterSession for ArenaDrafter
                  (serve/drafter_runner.py), which owns the arena as torch CUDA tensors
  open_trt_engine a build stage output -> EngineModel (serve/engine_runners.py)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from trtllm_dflash.build import engine_io
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe.engine_layout import kv_reuse_honoured
from trtllm_dflash.recipe.planner import KV_CACHE_FREE_GPU_MEM_FRACTION
from trtllm_dflash.serve.fake_executor import AdditionalOutput, Response, Result


def _bindings():
    """tensorrt_llm.bindings.executor (the nanobind module of TensorRT-LLM 1.2.1)."""
    import tensorrt_llm.bindings.executor as bindings

    return bindings


def executor_worker_path() -> Path:
    """The wheel's `tensorrt_llm/bin/executorWorker` (setup.py package_data), which orchestrator
    mode spawns per rank."""
    import tensorrt_llm

    return Path(tensorrt_llm.__file__).parent / "bin" / "executorWorker"


def executor_config(world_size: int, *, kv_block_reuse: bool = True,
                    free_gpu_memory_fraction: float = KV_CACHE_FREE_GPU_MEM_FRACTION,
                    device_ids: list[int] | None = None, bindings=None):
    """ExecutorConfig(max_beam_width=1, kv_cache_config=KvCacheConfig(enable_block_reuse=kv_block_reuse,
    free_gpu_memory_fraction=...), enable_chunked_context=False, additional_model_outputs=[the
    DFlash outputs]) and, for world_size > 1, parallel_config=ParallelConfig(CommunicationType.MPI,
    CommunicationMode.ORCHESTRATOR, device_ids=..., orchestrator_config=OrchestratorConfig(True,
    <executorWorker>)): tensorrt_llm.bindings.executor (cpp/tensorrt_llm/nanobind/executor/
    executorConfig.cpp). Chunked context stays off: a chunk boundary would split a verify
    request's tail rows across steps (engine-path.md §8.2). `kv_block_reuse`: what the engine can
    honour (engine_kv_reuse); asking more only earns fixExecutorConfig's warning."""
    b = bindings or _bindings()
    kwargs = dict(
        max_beam_width=1,
        kv_cache_config=b.KvCacheConfig(enable_block_reuse=kv_block_reuse,
                                        free_gpu_memory_fraction=free_gpu_memory_fraction),
        enable_chunked_context=False,
        additional_model_outputs=[b.AdditionalModelOutput(name, gather_context=g)
                                  for name, g in engine_io.GATHER_CONTEXT.items()],
    )
    if world_size > 1:
        kwargs["parallel_config"] = b.ParallelConfig(
            b.CommunicationType.MPI, b.CommunicationMode.ORCHESTRATOR, device_ids=device_ids,
            orchestrator_config=b.OrchestratorConfig(True, str(executor_worker_path())))
    return b.ExecutorConfig(**kwargs)


class TrtExecutor:
    """A 1.2.1 `tensorrt_llm.bindings.executor.Executor` with FakeExecutor's interface (what
    EngineTarget calls): requests are serve/fake_executor.py Requests, responses carry the
    requested DFlash outputs under their plain names (engine_io.executor_outputs).

    A request that asks for a context output (`dflash_ctx`, prefill) also asks for perf metrics,
    and a response whose KV blocks were reused is turned into an error: 1.2.1 returns context
    outputs as [promptLen, ...] with the reused rows left unwritten (llmRequest.h
    allocAdditionalOutputs, inflightBatchingUtils.cpp copyAdditionalOutputs). EngineTarget gives
    every prefill a fresh cache salt, so this does not happen unless salts collide."""

    def __init__(self, executor, bindings=None):
        self.ex, self.b = executor, bindings or _bindings()
        self._asked: dict[int, dict[str, bool]] = {}

    def enqueue_request(self, request) -> int:
        """Executor.enqueue_request(Request(input_token_ids, max_tokens, *, streaming,
        output_config=OutputConfig(exclude_input_from_output, return_perf_metrics,
        additional_model_outputs=[AdditionalModelOutput(name, gather_context)]), cache_salt_id))
        (cpp/tensorrt_llm/nanobind/executor/request.cpp: everything after max_tokens is keyword-only)."""
        b = self.b
        asked = {o.name: bool(o.gather_context) for o in request.output_config.additional_model_outputs}
        outputs = b.OutputConfig(exclude_input_from_output=True, return_perf_metrics=any(asked.values()),
                                 additional_model_outputs=[b.AdditionalModelOutput(n, gather_context=g)
                                                           for n, g in asked.items()])
        rid = self.ex.enqueue_request(b.Request(list(request.input_token_ids), request.max_tokens, streaming=False,
                                                output_config=outputs, cache_salt_id=request.cache_salt_id))
        self._asked[rid] = asked
        return rid

    def await_responses(self, request_id: int) -> list[Response]:
        """Executor.await_responses(id) (blocks until one is ready) -> [Response]: has_error(),
        error_msg, result.{output_token_ids, is_final, additional_outputs, request_perf_metrics}."""
        asked = self._asked.get(request_id, {})
        out = []
        for resp in self.ex.await_responses(request_id):
            if resp.has_error():
                out.append(Response(request_id, error_msg=resp.error_msg))
                continue
            res = resp.result
            metrics = getattr(res, "request_perf_metrics", None)
            reused = metrics.kv_cache_metrics.num_reused_blocks if metrics is not None else 0
            if any(asked.values()) and reused:
                out.append(Response(request_id, error_msg=f"{reused} KV-cache blocks were reused, so their context "
                                                          "output rows were not computed (the cache salt must be new)"))
                continue
            tensors = engine_io.executor_outputs(res.additional_outputs, asked)
            out.append(Response(request_id, Result([list(t) for t in res.output_token_ids], bool(res.is_final),
                                                   [AdditionalOutput(n, t) for n, t in tensors.items()])))
        if any(r.error_msg is not None or r.result.is_final for r in out):
            self._asked.pop(request_id, None)
        return out

    def cancel_request(self, request_id: int) -> None:
        """Executor.cancel_request(id)."""
        self.ex.cancel_request(request_id)
        self._asked.pop(request_id, None)

    def shutdown(self) -> None:
        """Executor.shutdown()."""
        self.ex.shutdown()


def open_executor(engine_dir: str | Path, world_size: int, **config) -> TrtExecutor:
    """Executor(engine_dir, ModelType.DECODER_ONLY, executor_config(...)) (tensorrt_llm.bindings.executor)."""
    b = _bindings()
    return TrtExecutor(b.Executor(Path(engine_dir), b.ModelType.DECODER_ONLY, executor_config(world_size, **config)), b)


_TORCH_DTYPES = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16, "FP8": torch.float8_e4m3fn,
                 "INT32": torch.int32, "INT64": torch.int64}


class TrtSession:
    """The drafter engine on the TensorRT 10.14 runtime: tensorrt.Runtime.deserialize_cuda_engine,
    ICudaEngine.create_execution_context / get_tensor_shape / get_tensor_dtype,
    IExecutionContext.set_input_shape / set_tensor_address / execute_async_v3, on its own torch
    CUDA stream ordered after the caller's. `import tensorrt_llm` first loads TensorRT-LLM's plugin
    library (tensorrt_llm/_common.py _init -> plugin._load_plugin_lib: the engine's gemm plugin);
    our AOT plugins are in the engine itself."""

    def __init__(self, engine_dir: str | Path, device: str = "cuda"):
        import tensorrt as trt
        import tensorrt_llm  # noqa: F401

        engine_dir = Path(engine_dir)
        cfg = json.loads((engine_dir / "config.json").read_text())
        pretrained = cfg["pretrained_config"]
        if pretrained["mapping"].get("world_size", 1) > 1:
            raise UserError(f"{engine_dir}: a drafter engine built for tp = {pretrained['mapping']['tp_size']}; the drafter "
                            "runner runs tp = 1 engines (one process, one GPU); build the drafter at tp 1")
        self.device = torch.device(device)
        self.engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(
            (engine_dir / "rank0.engine").read_bytes())
        if self.engine is None:
            raise RuntimeError(f"{engine_dir / 'rank0.engine'}: TensorRT could not deserialize it (TensorRT version?)")
        self.context = self.engine.create_execution_context()
        self.stream = torch.cuda.Stream(self.device)
        dtype = lambda name: _TORCH_DTYPES[self.engine.get_tensor_dtype(name).name]  # noqa: E731
        self.num_layers = int(pretrained["num_hidden_layers"])
        _, _, self.num_kv_heads, self.head_dim = tuple(self.engine.get_tensor_shape("k_cache_0"))
        self.vocab_size = int(self.engine.get_tensor_shape("draft_logits")[2])
        self.dtype, self.kv_dtype = dtype("ctx_rows"), dtype("k_cache_0")
        self.max_len = int(cfg["build_config"]["max_seq_len"])
        self.config = pretrained

    def run(self, inputs, outputs):
        """IExecutionContext.set_input_shape / set_tensor_address for every input and output (the
        arena inputs and present outputs share addresses), then execute_async_v3(stream)."""
        for name, t in inputs.items():
            self.context.set_input_shape(name, tuple(t.shape))
            self.context.set_tensor_address(name, t.data_ptr())
        for name, t in outputs.items():
            self.context.set_tensor_address(name, t.data_ptr())
        caller = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(caller)
        if not self.context.execute_async_v3(self.stream.cuda_stream):
            raise RuntimeError("the drafter engine failed to run (TensorRT execute_async_v3 returned False)")
        caller.wait_stream(self.stream)


def engine_kv_reuse(build_dir: Path) -> bool:
    """KV block reuse for the target Executor of a build output: what its plan settled
    (plan.json kv_block_reuse, from the recipe's build.kv_cache_reuse) where the target engine
    was built with paged context FMHA (its config.json), as the 1.2.1 Executor honours it
    (recipe/engine_layout.py kv_reuse_honoured)."""
    plan = json.loads((build_dir / "plan.json").read_text())
    build_config = json.loads((build_dir / "target" / "engines" / "config.json").read_text())["build_config"]
    pc = build_config.get("plugin_config", {})
    return kv_reuse_honoured(bool(plan.get("kv_block_reuse", True)),
                             paged_context_fmha=bool(pc.get("use_paged_context_fmha")),
                             gather_context_logits=bool(build_config.get("gather_context_logits")))


def _engine_dirs(build_dir: Path) -> tuple[Path, Path]:
    plan = build_dir / "plan.json"
    if not plan.is_file():
        raise UserError(f"{build_dir}: no plan.json; not an output of `trtllm-dflash build`")
    dirs = tuple(build_dir / role / "engines" for role in ("target", "drafter"))
    for d in dirs:
        if not (d / "rank0.engine").is_file() or not (d / "config.json").is_file():
            raise UserError(f"{d}: no rank0.engine / config.json (a --dry-run build?); build the engines with "
                            "`trtllm-dflash build` inside the TensorRT-LLM 1.2.x container")
    return dirs


def open_trt_engine(build_dir: str | Path, *, device: str = "cuda",
                    free_gpu_memory_fraction: float = KV_CACHE_FREE_GPU_MEM_FRACTION):
    """The engine runners over a build stage output: the target Executor (TrtExecutor) and the
    drafter engine (TrtSession, one per process, shared by the decoders' ArenaDrafters)."""
    from trtllm_dflash.serve.checkpoint_runner import reference_configs
    from trtllm_dflash.serve.drafter_runner import ArenaDrafter
    from trtllm_dflash.serve.engine_runners import EngineModel

    target_dir, drafter_dir = _engine_dirs(Path(build_dir))
    tc = json.loads((target_dir / "config.json").read_text())["pretrained_config"]
    dc = json.loads((drafter_dir / "config.json").read_text())["pretrained_config"]
    tcfg, d = reference_configs(tc, dc, target_dir, drafter_dir)
    session = TrtSession(drafter_dir, device)
    executor = open_executor(target_dir, int(tc["mapping"].get("world_size", 1)),
                             kv_block_reuse=engine_kv_reuse(Path(build_dir)),
                             free_gpu_memory_fraction=free_gpu_memory_fraction)

    def drafter(max_len: int) -> ArenaDrafter:
        return ArenaDrafter(session, block_size=d.block_size, mask_token_id=d.mask_token_id,
                            target_layer_ids=tuple(d.target_layer_ids), max_len=max_len)

    return EngineModel(executor, None, d, vocab_size=tcfg.vocab_size,
                       eos_token_ids=tcfg.eos_token_ids, device=device,
                       drafter_factory=drafter)
