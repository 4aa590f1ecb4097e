"""The engine backend's TensorRT runners (GPU-only: tensorrt / tensorrt_llm are imported inside the
functions, so this module imports on CPU and its logic is tested there with stand-ins).

  parallel_config / executor_config / open_executor   the target engine's TensorRT-LLM 1.2.1
                  Executor; at tp > 1 in leader mode (docs/engine-tp.md): one process per rank
                  under mpirun, rank 0 the leader that takes requests
  TrtExecutor     that Executor behind the interface EngineTarget (runtime/engine_runners.py)
                  drives, FakeExecutor's: requests in, responses with the DFlash outputs by name
  WorkerRank      a rank > 0 of that Executor: runs the target's shard, nothing of ours
  TrtSession      the drafter engine on the TensorRT runtime, a DrafterSession for ArenaDrafter
                  (runtime/drafter_runner.py), which owns the arena as torch CUDA tensors
  open_trt_engine a build stage output -> EngineModel (runtime/engine_runners.py) on rank 0, a
                  WorkerRank on the others
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

import torch

from trtllm_dflash.errors import UserError
from trtllm_dflash.formats import engine_io
from trtllm_dflash.recipe.plan.engine_layout import kv_reuse_honoured
from trtllm_dflash.recipe.plan.engine_memory import EXECUTOR_OUTPUTS
from trtllm_dflash.recipe.plan.rows import KV_CACHE_FREE_GPU_MEM_FRACTION
from trtllm_dflash.runtime.fake_executor import AdditionalOutput, Response, Result


def _bindings():
    """tensorrt_llm.bindings.executor (the nanobind module of TensorRT-LLM 1.2.1)."""
    import tensorrt_llm.bindings.executor as bindings

    return bindings


# What MPI launchers give each rank, in the order they are believed: Open MPI's mpirun
# (OMPI_COMM_WORLD_RANK), PMIx (PMIX_RANK: srun --mpi=pmix, PRRTE), MPICH / Hydra (PMI_RANK,
# PMI_ID), and Slurm's own task id last. mpirun started inside a Slurm task (an sbatch step, an
# `srun --pty` shell) hands every child that task's SLURM_PROCID, 0 for all of them, while
# TensorRT-LLM's Executor takes each child's real MPI rank; Slurm's id is only right when srun
# itself starts one rank per task.
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "PMI_ID", "SLURM_PROCID")


def mpi_rank() -> int:
    """This process's rank in the MPI world it was started in: the launcher's own variable
    (RANK_VARIABLES, Slurm's last), else mpi4py's world communicator where MPI is already
    initialised here; 0 outside one."""
    for var in RANK_VARIABLES:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    mpi = sys.modules.get("mpi4py.MPI")  # imported, so initialised: asking it starts nothing new
    if mpi is not None and mpi.Is_initialized():
        return int(mpi.COMM_WORLD.Get_rank())
    return 0


def rank_devices(world_size: int, device_ids: list[int] | None = None, num_nodes: int = 1) -> list[int]:
    """The GPU of each rank on a node (ParallelConfig.device_ids): given, or 0 .. ranks per node - 1;
    one distinct id per rank of a node (runtime/worldConfig.cpp checks them unique). At world
    size 1 there is no ParallelConfig and the Executor takes the first GPU it sees: ids other
    than [0] are refused."""
    if world_size == 1 and device_ids not in (None, [0]):
        raise UserError(f"gpu_device_ids: {','.join(map(str, device_ids))} at tp 1: the Executor runs on the first GPU "
                        "it sees; pick the GPU with CUDA_VISIBLE_DEVICES instead and leave gpu_device_ids unset")
    if num_nodes < 1 or world_size % num_nodes:
        raise UserError(f"num_nodes: {num_nodes} does not divide the world size {world_size} (tp x pp)")
    per_node = world_size // num_nodes
    devices = list(range(per_node)) if device_ids is None else list(device_ids)
    if len(devices) != per_node or len(set(devices)) != per_node or min(devices) < 0:
        raise UserError(f"gpu_device_ids: {','.join(map(str, devices))}: need {per_node} distinct GPU ids (one per "
                        f"rank on each of {num_nodes} node(s), world size {world_size})")
    return devices


def parallel_config(world_size: int, *, device_ids: list[int] | None = None, num_nodes: int = 1, bindings=None):
    """The target Executor's ParallelConfig: None at world size 1; else TensorRT-LLM 1.2.x leader
    mode, ParallelConfig(CommunicationType.MPI, CommunicationMode.LEADER, device_ids,
    participant_ids) (cpp/tensorrt_llm/nanobind/executor/executorConfig.cpp): every MPI rank is a
    participant (0 .. world_size - 1, rank 0 the leader that takes requests and returns
    responses) and drives the GPU device_ids[rank % ranks per node] (runtime/worldConfig.cpp).
    device_ids defaults to one node's 0 .. ranks per node - 1; num_nodes > 1 is passed on
    (executorImpl.cpp initializeWorkers: device_ids x num_nodes must be the world size).
    Why leader mode and not orchestrator mode: docs/engine-tp.md."""
    if world_size == 1:
        return None
    b = bindings or _bindings()
    kwargs = dict(device_ids=rank_devices(world_size, device_ids, num_nodes), participant_ids=list(range(world_size)))
    if num_nodes > 1:
        kwargs["num_nodes"] = num_nodes
    return b.ParallelConfig(b.CommunicationType.MPI, b.CommunicationMode.LEADER, **kwargs)


def executor_config(world_size: int, *, kv_block_reuse: bool = True,
                    free_gpu_memory_fraction: float = KV_CACHE_FREE_GPU_MEM_FRACTION,
                    device_ids: list[int] | None = None, num_nodes: int = 1, bindings=None):
    """ExecutorConfig(max_beam_width=1, kv_cache_config=KvCacheConfig(enable_block_reuse=kv_block_reuse,
    free_gpu_memory_fraction=...), enable_chunked_context=False, additional_model_outputs=[the
    DFlash outputs of EXECUTOR_OUTPUTS: not dflash_logits, which the Executor would pre-allocate at
    max_num_tokens x block x vocab fp32, recipe/plan/engine_memory.py], parallel_config=parallel_config(...)):
    tensorrt_llm.bindings.executor
    (cpp/tensorrt_llm/nanobind/executor/executorConfig.cpp). Chunked context stays off: a chunk
    boundary would split a verify request's tail rows across steps (docs/design/engine-path.md).
    `kv_block_reuse`: what the engine can honour (engine_kv_reuse); asking more only earns
    fixExecutorConfig's warning. free_gpu_memory_fraction is each rank's, but every rank gets the
    KV token count of the tightest one (kvCacheManager.cpp: an MPI all-reduce MIN)."""
    b = bindings or _bindings()
    kwargs = dict(
        max_beam_width=1,
        kv_cache_config=b.KvCacheConfig(enable_block_reuse=kv_block_reuse,
                                        free_gpu_memory_fraction=free_gpu_memory_fraction),
        enable_chunked_context=False,
        additional_model_outputs=[b.AdditionalModelOutput(name, gather_context=g)
                                  for name, g in engine_io.GATHER_CONTEXT.items() if name in EXECUTOR_OUTPUTS],
    )
    parallel = parallel_config(world_size, device_ids=device_ids, num_nodes=num_nodes, bindings=b)
    if parallel is not None:
        kwargs["parallel_config"] = parallel
    return b.ExecutorConfig(**kwargs)


class TrtExecutor:
    """A 1.2.1 `tensorrt_llm.bindings.executor.Executor` with FakeExecutor's interface (what
    EngineTarget calls): requests are runtime/fake_executor.py Requests, responses carry the
    requested DFlash outputs under their plain names (engine_io.executor_outputs).

    A request that asks for a context output (`dflash_ctx`, prefill) also asks for perf metrics,
    and a response whose KV blocks were reused is turned into an error: 1.2.1 returns context
    outputs as [promptLen, ...] with the reused rows left unwritten (llmRequest.h
    allocAdditionalOutputs, inflightBatchingUtils.cpp copyAdditionalOutputs). EngineTarget gives
    every prefill a fresh cache salt, so this does not happen unless salts collide."""

    registered = EXECUTOR_OUTPUTS  # what executor_config registers with the Executor

    def __init__(self, executor, bindings=None):
        self.ex, self.b = executor, bindings or _bindings()
        self._asked: dict[int, dict[str, bool]] = {}

    def _binding(self, request):
        """(the binding's Request, {output name: gather_context}) of a fake_executor.Request:
        Request(input_token_ids, max_tokens, *, streaming, output_config=OutputConfig(
        exclude_input_from_output, return_perf_metrics, additional_model_outputs=
        [AdditionalModelOutput(name, gather_context)]), cache_salt_id)
        (cpp/tensorrt_llm/nanobind/executor/request.cpp: everything after max_tokens is keyword-only)."""
        b = self.b
        asked = {o.name: bool(o.gather_context) for o in request.output_config.additional_model_outputs}
        unbound = [n for n in asked if n not in EXECUTOR_OUTPUTS]
        if unbound:
            raise RuntimeError(f"{unbound[0]}: not registered with the Executor, which would pre-allocate it at "
                               "max_num_tokens x block x vocab fp32 (recipe/plan/engine_memory.py); the engine backend "
                               "verifies greedily on GPU (temperature 0)")
        outputs = b.OutputConfig(exclude_input_from_output=True, return_perf_metrics=any(asked.values()),
                                 additional_model_outputs=[b.AdditionalModelOutput(n, gather_context=g)
                                                           for n, g in asked.items()])
        req = b.Request(list(request.input_token_ids), request.max_tokens, streaming=False, output_config=outputs,
                        cache_salt_id=request.cache_salt_id)
        return req, asked

    def enqueue_request(self, request) -> int:
        """Executor.enqueue_request(request) -> its id."""
        req, asked = self._binding(request)
        rid = self.ex.enqueue_request(req)
        self._asked[rid] = asked
        return rid

    def enqueue_requests(self, requests) -> list[int]:
        """Executor.enqueue_requests(requests) -> their ids (cpp/tensorrt_llm/nanobind/executor/
        executor.cpp): one call, so the Executor's next step can take every request of a round."""
        converted = [self._binding(r) for r in requests]
        ids = list(self.ex.enqueue_requests([req for req, _ in converted]))
        for rid, (_, asked) in zip(ids, converted):
            self._asked[rid] = asked
        return ids

    def await_responses(self, request_id: int, timeout_s: float | None = None) -> list[Response]:
        """Executor.await_responses(id, timeout) (blocks until one is ready, or, given a timeout,
        at most that long: then []) -> [Response]: has_error(), error_msg, result.{output_token_ids,
        is_final, additional_outputs, request_perf_metrics}. The binding's timeout is a
        std::chrono::milliseconds (nanobind/executor/executor.cpp), passed as a timedelta."""
        asked = self._asked.get(request_id, {})
        out = []
        wait = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
        for resp in self.ex.await_responses(request_id, timeout=wait):
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


class WorkerRank:
    """A rank > 0 of the target Executor in leader mode. The Executor's own threads run this
    rank's shard of the target engine in step with the leader, which broadcasts every step's new
    requests to the tensor-parallel group (cpp/tensorrt_llm/executor/executorImpl.cpp
    getNewReqWithIds): no request or round loop of ours runs here. serve() blocks until the
    leader shuts down: first `drafter_loop` (a split drafter: this rank's shard, run in step
    with rank 0 until it says stop: runtime/drafter_ranks.py), then Executor.shutdown(), which on a
    non-leader joins the execution thread that ends on the leader's terminate request
    (executorImpl.cpp shutdown). Upstream's Python model ends its initialize the same way on such
    ranks (triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/1/model.py: "In leader
    mode, worker ranks will wait here until leader is done")."""

    def __init__(self, executor, drafter_loop=None):
        self.ex, self.drafter_loop = executor, drafter_loop

    def serve(self) -> None:
        if self.drafter_loop is not None:
            self.drafter_loop()
        self.ex.shutdown()


def open_executor(engine_dir: str | Path, world_size: int, *, bindings=None, **config):
    """Executor(engine_dir, ModelType.DECODER_ONLY, executor_config(...)) (tensorrt_llm.bindings.executor):
    a TrtExecutor where it takes requests (Executor.can_enqueue_requests(): the only rank at world
    size 1, the leader in leader mode), a WorkerRank on the other ranks."""
    b = bindings or _bindings()
    ex = b.Executor(Path(engine_dir), b.ModelType.DECODER_ONLY, executor_config(world_size, bindings=b, **config))
    return TrtExecutor(ex, b) if ex.can_enqueue_requests() else WorkerRank(ex)


_TORCH_DTYPES = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16, "FP8": torch.float8_e4m3fn,
                 "INT32": torch.int32, "INT64": torch.int64}


class TrtSession:
    """The drafter engine on the TensorRT 10.14 runtime: tensorrt.Runtime.deserialize_cuda_engine,
    ICudaEngine.create_execution_context / get_tensor_shape / get_tensor_dtype,
    IExecutionContext.set_input_shape / set_tensor_address / execute_async_v3, on its own torch
    CUDA stream ordered after the caller's. `import tensorrt_llm` first loads TensorRT-LLM's plugin
    library (tensorrt_llm/_common.py _init -> plugin._load_plugin_lib: the engine's gemm and NCCL
    plugins); our AOT plugins are in the engine itself. A split drafter's engine `rank{rank}` also
    takes the custom all-reduce workspace every rank allocates together
    (tensorrt_llm/plugin/plugin.py CustomAllReduceHelper.allocate_workspace, as
    tensorrt_llm/runtime/generation.py does for a tp > 1 engine)."""

    def __init__(self, engine_dir: str | Path, device: str = "cuda", rank: int = 0, peers: tuple[int, ...] = ()):
        import tensorrt as trt
        import tensorrt_llm  # noqa: F401

        engine_dir = Path(engine_dir)
        cfg = json.loads((engine_dir / "config.json").read_text())
        pretrained = cfg["pretrained_config"]
        self.device = torch.device(device)
        path = engine_dir / f"rank{rank}.engine"
        # TensorRT binds the engine and its context's activation memory, torch the stream, and
        # IpcMemory's cudaMalloc the workspace to the CURRENT device: make it this rank's first, as
        # upstream does (commands/build.py build_and_save, runtime/generation.py).
        with torch.cuda.device(self.device):
            # The runtime (and its logger) outlive the engine they made, as TensorRT-LLM's own
            # runtime/session.py keeps them.
            self.logger = trt.Logger(trt.Logger.WARNING)
            self.runtime = trt.Runtime(self.logger)
            self.engine = self.runtime.deserialize_cuda_engine(path.read_bytes())
            if self.engine is None:
                raise RuntimeError(f"{path}: TensorRT could not deserialize it (TensorRT version?)")
            self.context = self.engine.create_execution_context()
            self.stream = torch.cuda.Stream(self.device)
            self.fixed = self._all_reduce_workspace(int(pretrained["mapping"].get("tp_size", 1)), rank, peers)
        dtype = lambda name: _TORCH_DTYPES[self.engine.get_tensor_dtype(name).name]  # noqa: E731
        self.num_layers = int(pretrained["num_hidden_layers"])
        _, _, self.num_kv_heads, self.head_dim = tuple(self.engine.get_tensor_shape("k_cache_0"))
        self.vocab_size = int(self.engine.get_tensor_shape("draft_logits")[2])
        self.dtype, self.kv_dtype = dtype("ctx_rows"), dtype("k_cache_0")
        self.max_len = int(cfg["build_config"]["max_seq_len"])
        self.config = pretrained

    def _all_reduce_workspace(self, tp: int, rank: int, peers: tuple[int, ...]) -> dict[str, torch.Tensor]:
        """Peer access to the other ranks' GPUs, then the workspace (runtime/generation.py's order)."""
        if tp == 1:
            return {}
        from tensorrt_llm.mapping import Mapping
        from tensorrt_llm.plugin.plugin import CustomAllReduceHelper

        enable_peer_access(torch.cuda.current_device(), peers)
        mapping = Mapping(world_size=tp, rank=rank, tp_size=tp)
        self._ipc, workspace = CustomAllReduceHelper.allocate_workspace(
            mapping, CustomAllReduceHelper.max_workspace_size_auto(tp))
        return {"all_reduce_workspace": workspace}

    def run(self, inputs, outputs):
        """IExecutionContext.set_input_shape / set_tensor_address for every input and output (the
        arena inputs and present outputs share addresses), then execute_async_v3(stream), with the
        engine's GPU current whichever thread calls."""
        for name, t in {**inputs, **self.fixed}.items():
            self.context.set_input_shape(name, tuple(t.shape))
            self.context.set_tensor_address(name, t.data_ptr())
        for name, t in outputs.items():
            self.context.set_tensor_address(name, t.data_ptr())
        with torch.cuda.device(self.device):
            caller = torch.cuda.current_stream(self.device)
            self.stream.wait_stream(caller)
            if not self.context.execute_async_v3(self.stream.cuda_stream):
                raise RuntimeError("the drafter engine failed to run (TensorRT execute_async_v3 returned False)")
            caller.wait_stream(self.stream)


def enable_peer_access(device: int, peers: tuple[int, ...]) -> None:
    """tensorrt_llm/_ipc_utils.py set_peer_access over the ranks' real GPU ids (upstream takes
    tp ranks for device ids, which device_ids may reorder): from `device` (current) to every peer
    GPU that can be reached directly, through cuda-python's runtime as upstream; a pair that
    cannot is left to the all-reduce's own fallback (1.2's allocate_workspace checks peer access
    itself); already enabled is fine."""
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        from cuda import cudart

    ok = cudart.cudaError_t.cudaSuccess
    for peer in peers:
        if peer == device:
            continue
        error, can = cudart.cudaDeviceCanAccessPeer(device, peer)
        if error != ok or not can:
            continue
        cudart.cudaDeviceEnablePeerAccess(peer, 0)
        error = cudart.cudaGetLastError()[0]
        if error not in (ok, cudart.cudaError_t.cudaErrorPeerAccessAlreadyEnabled):
            raise RuntimeError(f"enabling peer access from GPU {device} to GPU {peer}: {error}")


def engine_kv_reuse(build_dir: Path) -> bool:
    """KV block reuse for the target Executor of a build output: what its plan settled
    (plan.json kv_block_reuse, from the recipe's build.kv_cache_reuse) where the target engine
    was built with paged context FMHA (its config.json), as the 1.2.1 Executor honours it
    (recipe/plan/engine_layout.py kv_reuse_honoured)."""
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
        world = json.loads((d / "config.json").read_text())["pretrained_config"]["mapping"].get("world_size", 1)
        missing = [f"rank{r}.engine" for r in range(world) if not (d / f"rank{r}.engine").is_file()]
        if missing:
            raise UserError(f"{d}: no {missing[0]} of its {world} ranks; build again")
    return dirs


def drafter_placement_of(build_dir: Path, world_size: int) -> str:
    """Where a build output's drafter runs: plan.json drafter_parallelism.placement (the rule of
    recipe/plan/drafter.py drafter_placement when it was built); "split" for a tp > 1 plan written
    before placements were recorded (its drafter engines are per rank)."""
    plan = json.loads((build_dir / "plan.json").read_text())
    return plan.get("drafter_parallelism", {}).get("placement", "rank0" if world_size == 1 else "split")


def open_trt_engine(build_dir: str | Path, *, device: str = "cuda",
                    free_gpu_memory_fraction: float = KV_CACHE_FREE_GPU_MEM_FRACTION,
                    device_ids: list[int] | None = None, bindings=None, session_cls=None, rank_group=None):
    """The engine runners over a build stage output, in this process's rank: on the rank that
    takes requests an EngineModel over the target Executor (TrtExecutor) and the drafter engine
    (TrtSession, one per process, shared by the decoders' ArenaDrafters); on the other ranks of a
    tp > 1 deployment a WorkerRank. The drafter is placed as the build recorded (docs/engine-tp.md):
    rank0, the whole drafter on rank 0's GPU (device_ids[0]); split, a shard on every rank's GPU,
    run in step through runtime/drafter_ranks.py. Drafter engines are opened before the Executor
    sizes its KV pool from the free memory. `bindings` / `session_cls` / `rank_group` (rank,
    world, device) -> RankGroup: stand-ins for CPU tests."""
    from trtllm_dflash.runtime.checkpoint import reference_configs
    from trtllm_dflash.runtime.drafter_ranks import SplitDrafters, TorchRankGroup, serve_drafter_rank
    from trtllm_dflash.runtime.drafter_runner import ArenaDrafter
    from trtllm_dflash.runtime.engine_runners import EngineModel
    from trtllm_dflash.runtime.executor_health import ExecutorHealth, cuda_probe

    build_dir = Path(build_dir)
    target_dir, drafter_dir = _engine_dirs(build_dir)
    tc = json.loads((target_dir / "config.json").read_text())["pretrained_config"]
    dc = json.loads((drafter_dir / "config.json").read_text())["pretrained_config"]
    world = int(tc["mapping"].get("world_size", 1))
    split = drafter_placement_of(build_dir, world) == "split"
    rank = mpi_rank() if world > 1 else 0
    devices = rank_devices(world, device_ids)  # refused here, before anything opens
    peers: tuple[int, ...] = ()
    if world > 1:
        device = f"cuda:{devices[rank % len(devices)]}"  # this rank's GPU (runtime/worldConfig.cpp getDevice)
        torch.cuda.set_device(device)  # everything of this rank from here on (the session, NCCL, stubs' threads)
        peers = tuple(devices) if split else ()
    opened = session_cls or TrtSession
    session = opened(drafter_dir, device, rank if split else 0, peers) if split or rank == 0 else None
    executor = open_executor(target_dir, world, bindings=bindings, kv_block_reuse=engine_kv_reuse(build_dir),
                             free_gpu_memory_fraction=free_gpu_memory_fraction, device_ids=device_ids)
    group = (rank_group or TorchRankGroup.from_mpi)(rank, world, device) if split else None
    tcfg, d = reference_configs(tc, dc, target_dir, drafter_dir)

    def drafter(max_len: int) -> ArenaDrafter:
        return ArenaDrafter(session, block_size=d.block_size, mask_token_id=d.mask_token_id,
                            target_layer_ids=tuple(d.target_layer_ids), max_len=max_len)

    if isinstance(executor, WorkerRank):
        return WorkerRank(executor.ex, (lambda: serve_drafter_rank(group, drafter)) if split else None)
    if session is None:
        raise RuntimeError(f"MPI rank {rank}: the Executor made this process its leader, but rank 0 holds the drafter")
    return EngineModel(executor, None, d, vocab_size=tcfg.vocab_size, eos_token_ids=tcfg.eos_token_ids, device=device,
                       drafter_factory=SplitDrafters(group, drafter) if split else drafter,
                       health=ExecutorHealth(probe=cuda_probe(device)))
